"""Several corpora (issue 20): the weighted mix, held-out sentences, one store per corpus, tags.

1. The mix: each epoch takes round(w x n) of a corpus's n pairs (w=2, 0.5, 1.3: full copies plus a
   seeded draw), as a function of (seed, epoch) alone; one corpus of weight 1 is batched exactly as
   `token_batches` batches it (what the bit-exact resume tests of a single corpus rely on).
2. Held-out splits given apart (--valid_data, --test_data) are the held-out store's, and their source
   sentences leave the training pairs of every corpus, counted per corpus; a folder given apart
   that has neither that split nor a train split alone is one line.
3. Adding a corpus reads and tokenizes only that corpus, in the stores and through train.py
   --init_from (tokenizers from the checkpoint); a tag gets its own token store whose source rows
   start with the tag's id; a tag the checkpoint's tokenizers lack is refused in one line.
4. A run on a weighted, tagged mix stopped mid-epoch and resumed ends bit for bit where an unbroken
   run ends, and logs each corpus's pairs per epoch (the line and data/pairs/<corpus>).
The 1-versus-2-rank equality of the mix is test_distributed.py's first test, which trains on one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import train_in_process
from config import get_config
from dataset import BatchPlan, BilingualDataset, CorpusMix, token_batches
from nmt.corpora.store import text_store, text_stores, token_stores, tokenizer_sample
from synthetic_data import synthetic_pairs, write_hub_dataset
from nmt.corpora.tokenizer import encode_ids, tag_id, train_tokenizer, train_tokenizers


def numbered_pairs(count: int, prefix: str) -> list[tuple[str, str]]:
    """Pairs that each carry a word of their own, so that every row can be traced."""
    return [(f"The word {prefix}{i} is here.", f"La parola {prefix}{i} è qui.") for i in range(count)]


# ---------------------------------------------------------------------------- the weighted mix

@pytest.fixture(scope="module")
def three_corpora() -> CorpusMix:
    pairs = numbered_pairs(120, "w")
    tok_src = train_tokenizer([s for s, _ in pairs], "wordlevel", 10_000, 1)
    tok_tgt = train_tokenizer([t for _, t in pairs], "wordlevel", 10_000, 1)
    return CorpusMix([BilingualDataset.from_pairs(pairs[start:end], tok_src, tok_tgt, seq_len=32)
                      for start, end in ((0, 50), (50, 90), (90, 120))])


def times_taken(plan: BatchPlan, epoch: int) -> np.ndarray:
    """How often epoch `epoch`'s batches hold each row of the dataset."""
    return np.bincount(np.concatenate(plan.epoch_batches(epoch)), minlength=len(plan.dataset))


def test_each_corpus_gives_round_w_times_n_pairs_an_epoch(three_corpora: CorpusMix) -> None:
    plan = BatchPlan(three_corpora, batch_tokens=60, seed=3, weights=(2.0, 0.5, 1.3))
    assert plan.corpus_pairs() == [100, 20, 39]
    for epoch in (0, 1):
        taken = times_taken(plan, epoch)
        first, second, third = taken[:50], taken[50:90], taken[90:]
        assert (first == 2).all()  # w=2: two full copies
        assert second.sum() == 20 and set(second) == {0, 1}  # w=0.5: half of it, each row at most once
        assert third.sum() == 39 and set(third) == {1, 2}  # w=1.3: all of it, and 9 rows once more
    # the fractions are drawn anew each epoch, as a function of (seed, epoch) alone
    assert (times_taken(plan, 0)[50:] != times_taken(plan, 1)[50:]).any()
    fresh = BatchPlan(three_corpora, batch_tokens=60, seed=3, weights=(2.0, 0.5, 1.3))
    assert [b.tolist() for b in fresh.epoch_batches(1)] == [b.tolist() for b in plan.epoch_batches(1)]
    other_seed = BatchPlan(three_corpora, batch_tokens=60, seed=4, weights=(2.0, 0.5, 1.3))
    assert (times_taken(other_seed, 1)[50:] != times_taken(plan, 1)[50:]).any()
    # a restarted process resuming at any step of the epoch gets the rest of the same micro-batches
    full = [(b.tolist(), tokens) for b, tokens in plan.micro_batches(1)]
    assert [(b.tolist(), tokens) for b, tokens in fresh.micro_batches(1, 5)] == full[5:]
    # rows of the mix are the rows of its corpora
    assert [ids.tolist() for ids in three_corpora[95]] == [ids.tolist() for ids in three_corpora.parts[2][5]]


def test_one_corpus_of_weight_one_is_batched_as_token_batches_does(three_corpora: CorpusMix) -> None:
    single = three_corpora.parts[0]
    for dataset in (single, CorpusMix([single])):
        plan = BatchPlan(dataset, batch_tokens=60, seed=3)
        expected = token_batches(single.src_lens, single.tgt_lens, 60, np.random.default_rng([3, 2]))
        assert [b.tolist() for b in plan.epoch_batches(2)] == [b.tolist() for b in expected]


# ---------------------------------------------------------------------------- stores

@pytest.fixture
def corpora_on_disk(tmp_path: Path) -> dict[str, Path]:
    """Two corpora whose training pairs repeat source sentences of held-out files given apart: a
    validation file pair (a folder with a train split alone) and a folder's test split."""
    validation, test = numbered_pairs(6, "v"), numbered_pairs(6, "t")
    leaked_a = [(source, "Altro.") for source, _ in validation[:2]]
    leaked_b = [(source, "Ancora.") for source, _ in validation[2:3] + test[:2]]
    return {
        "a": write_hub_dataset(tmp_path / "a", {"train": numbered_pairs(40, "a") + leaked_a,
                                                "validation": numbered_pairs(4, "own")}),
        "b": write_hub_dataset(tmp_path / "b", {"train": numbered_pairs(30, "b") + leaked_b}),
        "valid": write_hub_dataset(tmp_path / "valid", {"train": validation}),
        "test": write_hub_dataset(tmp_path / "test", {"train": numbered_pairs(5, "x"), "test": test}),
    }


def config_for(data: dict[str, Path], datasource: str, tmp_path: Path) -> dict:
    return {**get_config(), "datasource": datasource.format(**{name: str(path) for name, path in data.items()}),
            "valid_data": str(data["valid"]), "test_data": str(data["test"]), "min_frequency": 1, "seq_len": 32,
            "store_folder": str(tmp_path / "stores")}


def test_held_out_sentences_leave_every_corpus(corpora_on_disk: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    config = config_for(corpora_on_disk, "{a},{b}:2", tmp_path)
    first, second = text_stores(config)
    assert text_store(config).folder == first.folder
    assert first.pairs("validation") == numbered_pairs(6, "v") and first.pairs("test") == numbered_pairs(6, "t")
    held_out = {source for source, _ in first.pairs("validation") + first.pairs("test")}
    assert first.pairs("train") == numbered_pairs(40, "a") and second.pairs("train") == numbered_pairs(30, "b")
    assert not held_out & {source for source, _ in first.pairs("train") + second.pairs("train")}
    err = capsys.readouterr().err
    assert "a: removed 2 of 42 training pairs whose source sentence is in a held-out split" in err
    assert "b: removed 3 of 33 training pairs whose source sentence is in a held-out split" in err


def test_a_held_out_folder_without_that_split_is_one_line(corpora_on_disk: dict[str, Path], tmp_path: Path) -> None:
    refused = train_in_process(["--datasource", str(corpora_on_disk["b"]), "--test_data", str(corpora_on_disk["a"]),
                                "--preset", "tiny", "--store_folder", str(tmp_path / "stores"),
                                "--model_folder", str(tmp_path / "w"), "--runs_folder", str(tmp_path / "r")])
    assert refused.code == 1
    assert refused.stderr.strip().splitlines()[-1] == (f"train.py: error: --test_data '{corpora_on_disk['a']}' has no "
                                                       f"test split (found: train, validation)")


def test_adding_a_corpus_builds_only_its_stores_and_a_tag_its_own(corpora_on_disk: dict[str, Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    config = config_for(corpora_on_disk, "{a}", tmp_path)
    [text_a] = text_stores(config)
    tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, [text_a]))
    [tokens_a] = token_stores(config, [text_a], tok_src, tok_tgt)
    capsys.readouterr()
    added = config_for(corpora_on_disk, "{a},{b}:0.5:<BT>", tmp_path)
    texts = text_stores(added)
    tokens = token_stores(added, texts, tok_src, tok_tgt)
    assert texts[0].folder == text_a.folder and tokens[0].folder == tokens_a.folder
    built = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("building", "tokenizing"))]
    assert len(built) == 2 and all(str(tokens[1].folder) in line or str(texts[1].folder) in line for line in built)
    # the tag is the first source token of every row of its corpus, and counted in seq_len
    tag = tag_id(tok_src, "<BT>", "the test")
    rows = tokens[1].dataset("train")
    for row, (source, _) in enumerate(texts[1].pairs("train")[:5]):
        assert rows[row][0].tolist() == [tag, *encode_ids(tok_src, source)]
    assert rows.src_lens[0] == len(encode_ids(tok_src, texts[1].pairs("train")[0][0])) + 3
    untagged = token_stores(config_for(corpora_on_disk, "{a},{b}", tmp_path), texts, tok_src, tok_tgt)[1]
    assert untagged.folder != tokens[1].folder and untagged.dataset("train")[0][0].tolist()[0] != tag
    capsys.readouterr()
    third = config_for(corpora_on_disk, "{a},{b}:0.5:<BT>,{test}:3", tmp_path)
    more = token_stores(third, text_stores(third), tok_src, tok_tgt)
    assert [store.folder for store in more[:2]] == [store.folder for store in tokens]
    built = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("building", "tokenizing"))]
    assert len(built) == 2 and all("/test_en-it_" in line for line in built), built


# ---------------------------------------------------------------------------- through train.py

def test_init_from_tokenizes_only_an_added_corpus_and_refuses_a_tag_it_lacks(trained_run, tmp_path: Path) -> None:
    checkpoint, _ = trained_run.latest()
    other = write_hub_dataset(tmp_path / "other", {"train": synthetic_pairs(60, 7)})
    args = [*trained_run.args, "--init_from", str(checkpoint), "--model_folder", str(tmp_path / "w"),
            "--runs_folder", str(tmp_path / "r"), "--max_steps", "1", "--val_max_sentences", "2"]
    tagged = train_in_process(args + ["--datasource", f"{trained_run.datasource},{other}:1:<BT>"])
    assert tagged.code == 0, tagged.stderr
    built = [line for line in tagged.stderr.splitlines() if line.startswith(("building", "tokenizing"))]
    assert len(built) == 2 and all("/other_en-it_" in line for line in built), built
    refused = train_in_process(args + ["--datasource", f"{trained_run.datasource},{other}:1:<NEW>",
                                       "--experiment_name", "new_tag"])
    assert refused.code == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"train.py: error: tag <NEW> is not in the tokenizers of {checkpoint}; reserve it with --reserved_tags when "
        f"training the first model")


def test_a_weighted_mix_resumed_mid_epoch_equals_an_unbroken_run(tmp_path: Path) -> None:
    data = write_hub_dataset(tmp_path / "data", {"train": synthetic_pairs(120, 1), "validation": synthetic_pairs(4, 2),
                                                 "test": synthetic_pairs(4, 3)})
    synthetic = write_hub_dataset(tmp_path / "synthetic", {"train": synthetic_pairs(90, 5)})

    def run(name: str, steps: int) -> str:
        folder = tmp_path / name
        result = train_in_process([
            "--datasource", f"{data}:1.5,{synthetic}:0.5:<BT>", "--preset", "tiny", "--dropout", "0.1",
            "--batch_tokens", "256", "--num_epochs", "100", "--max_steps", str(steps), "--val_max_sentences", "2",
            "--model_folder", str(folder / "w"), "--runs_folder", str(folder / "r"),
            "--store_folder", str(tmp_path / "stores"), "--clean", "false"])  # the counts below: the pairs as written
        assert result.code == 0, result.stderr
        return result.stderr

    unbroken = run("unbroken", 12)
    assert "epoch 0: corpus data gave 180 pairs, corpus synthetic gave 45 pairs" in unbroken
    assert "epoch 1: corpus data gave 180 pairs" in unbroken, "the run must cross an epoch's end"
    run("broken", 4)
    assert "resuming from" in run("broken", 12)
    final = [torch.load(tmp_path / name / "w" / "data+synthetic_en-it" / "ckpt_00000012.pt",
                        weights_only=True)["model"] for name in ("unbroken", "broken")]
    for name in final[0]:
        assert torch.equal(final[0][name], final[1][name]), name
    events = EventAccumulator(str(tmp_path / "unbroken" / "r" / "data+synthetic_en-it"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("data/pairs/synthetic")] == [(0, 45), (1, 45)]
