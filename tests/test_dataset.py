"""dataset.py: loading Hub-layout folders, seeded splits, tokenizers without leakage, skipped
and dropped rows, per-batch padding and masks, token-budget batches and the batch plan."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from config import get_config
from dataset import (BatchPlan, BilingualDataset, DataError, MicroBatches, load_splits,
                     padding_waste, rows_to_pairs, token_batches)
from synthetic_data import synthetic_pairs, write_hub_dataset
from tokenizer import EOS_ID, PAD_ID, SOS_ID, UNK_ID, encode_ids, train_tokenizer, train_tokenizers

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def config_for(datasource: Path, **overrides) -> dict:
    return {**get_config(), "datasource": str(datasource), "min_frequency": 1, **overrides}


def numbered_pairs(count: int, prefix: str = "w") -> list[tuple[str, str]]:
    """Pairs that each carry a word of their own, so leakage of any row is visible."""
    return [(f"The word {prefix}{i} is here.", f"La parola {prefix}{i} è qui.") for i in range(count)]


# ---------------------------------------------------------------------------- loading and splitting

def test_loads_a_local_hub_layout_folder(tmp_path: Path) -> None:
    splits = {"train": synthetic_pairs(30, 1), "validation": synthetic_pairs(5, 2), "test": synthetic_pairs(7, 3)}
    folder = write_hub_dataset(tmp_path / "data", splits)
    loaded = load_splits(config_for(folder))
    assert loaded == splits


def test_train_only_source_is_split_by_seed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pairs = numbered_pairs(200)
    folder = write_hub_dataset(tmp_path / "data", {"train": pairs})
    first = load_splits(config_for(folder, seed=1))
    assert "split the train split with seed 1" in capsys.readouterr().err
    again = load_splits(config_for(folder, seed=1))
    other = load_splits(config_for(folder, seed=2))
    assert first == again  # every run and every resume sees the same split
    assert first["validation"] != other["validation"]
    assert (len(first["train"]), len(first["validation"]), len(first["test"])) == (180, 10, 10)
    together = first["train"] + first["validation"] + first["test"]
    assert sorted(together) == sorted(pairs)  # a partition: nothing lost, nothing shared
    custom = load_splits(config_for(folder, seed=1, val_fraction=0.1, test_fraction=0.2))
    assert (len(custom["validation"]), len(custom["test"])) == (20, 40)


def test_missing_test_split_is_carved_from_train_only(tmp_path: Path) -> None:
    validation = numbered_pairs(5, "v")
    folder = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(100), "validation": validation})
    loaded = load_splits(config_for(folder))
    assert loaded["validation"] == validation
    assert len(loaded["test"]) == 5 and len(loaded["train"]) == 95
    assert not set(loaded["test"]) & set(loaded["train"])


@pytest.mark.parametrize("source", ["train only", "three splits"])
def test_tokenizers_never_see_validation_or_test(tmp_path: Path, source: str) -> None:
    if source == "train only":
        folder = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(200)})  # 5% + 5% held out
    else:
        folder = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(80), "validation": numbered_pairs(
            10, "v"), "test": numbered_pairs(10, "t")})
    config = config_for(folder)
    splits = load_splits(config)
    tok_src, tok_tgt = train_tokenizers(config, lambda: iter(splits["train"]))
    held_out = {s.split()[2] for s, _ in splits["validation"] + splits["test"]}
    assert len(held_out) == 20
    for word in held_out:
        assert encode_ids(tok_src, word) == [UNK_ID]
        assert encode_ids(tok_tgt, word) == [UNK_ID]
    for source_text, _ in splits["train"][:5]:
        assert UNK_ID not in encode_ids(tok_src, source_text)


def test_bad_rows_are_skipped_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = synthetic_pairs(4, 1)
    bad = [{"id": "a", "translation": {"en": "No Italian."}},
           {"id": "b", "translation": {"en": "Null Italian.", "it": None}},
           {"id": "c", "translation": {"en": 42, "it": "Quarantadue."}},
           {"id": "d", "translation": {"en": "", "it": "Vuoto."}},
           {"id": "e", "translation": {"en": "Blank.", "it": "   "}}]
    folder = write_hub_dataset(tmp_path / "data", {"train": good[:2] + bad + good[2:],
                                                   "validation": good[:1], "test": good[:1]})
    splits = load_splits(config_for(folder))
    assert splits["train"] == good
    message = capsys.readouterr().err
    assert "train: skipped 5 of 9 rows" in message
    assert "2 missing side" in message and "1 non-text side" in message and "2 empty side" in message


def test_same_named_folders_and_edited_files_are_read_afresh(tmp_path: Path) -> None:
    """The datasets library caches by folder name and file layout; a stale entry must never
    change what is read (it once turned every sentence of the second folder into '"..."')."""
    held_out = {"validation": synthetic_pairs(2, 2), "test": synthetic_pairs(2, 3)}
    first = write_hub_dataset(tmp_path / "a" / "corpus", {"train": synthetic_pairs(6, 1), **held_out})
    assert load_splits(config_for(first))["train"] == synthetic_pairs(6, 1)
    mixed_types = [{"id": "x", "translation": {"en": 7, "it": "Sette."}}]
    second = write_hub_dataset(tmp_path / "b" / "corpus", {"train": synthetic_pairs(4, 4) + mixed_types, **held_out})
    assert load_splits(config_for(second))["train"] == synthetic_pairs(4, 4)
    write_hub_dataset(first, {"train": synthetic_pairs(3, 5), **held_out})  # the user edits the files
    assert load_splits(config_for(first))["train"] == synthetic_pairs(3, 5)


def test_rows_to_pairs_strips_and_checks_types() -> None:
    rows = [{"translation": {"en": "  Hi. ", "it": "Ciao.\n"}}, {"translation": {"en": ["list"], "it": "x"}},
            {"translation": "just text"}, None]
    assert rows_to_pairs(rows, "en", "it", "train") == [("Hi.", "Ciao.")]


def test_unusable_sources_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_splits(config_for(tmp_path / "nowhere"))
    folder = write_hub_dataset(tmp_path / "data", {"train": synthetic_pairs(5)})
    with pytest.raises(DataError, match="en-fr"):
        load_splits(config_for(folder, lang_tgt="fr"))
    only_bad = write_hub_dataset(tmp_path / "bad", {"train": [{"id": "1", "translation": {"en": "", "it": ""}}]})
    with pytest.raises(DataError, match="no usable"):
        load_splits(config_for(only_bad))


# ---------------------------------------------------------------------------- tensors and masks

@pytest.fixture(scope="module")
def tokenizers():
    pairs = synthetic_pairs(200, 1)
    return (train_tokenizer([s for s, _ in pairs], "wordlevel", 0, 1),
            train_tokenizer([t for _, t in pairs], "wordlevel", 0, 1))


def test_pairs_longer_than_seq_len_are_dropped_and_counted(tokenizers, capsys: pytest.CaptureFixture) -> None:
    tok_src, tok_tgt = tokenizers
    # "The cat." is 3 tokens, so 5 with [SOS]/[EOS]; its target "Il gatto." needs 3 + 1.
    pairs = [("The cat.", "Il gatto."), ("The cat sees the dog.", "Il gatto."), ("The cat.", "Il gatto vede il cane.")]
    dataset = BilingualDataset(pairs, tok_src, tok_tgt, seq_len=5, name="train")
    assert dataset.pairs == [pairs[0]]  # exactly at the limit is kept
    assert "train: dropped 2 of 3 pairs longer than seq_len 5" in capsys.readouterr().err
    assert list(dataset.src_lens) == [5] and list(dataset.tgt_lens) == [4]


def test_collate_pads_to_the_longest_in_the_batch_only(tokenizers) -> None:
    tok_src, tok_tgt = tokenizers
    pairs = [("The cat.", "Il gatto."), ("The big old man sees the dog.", "Il grande vecchio uomo vede il cane.")]
    dataset = BilingualDataset(pairs, tok_src, tok_tgt, seq_len=64)
    batch = dataset.collate([0, 1])
    src0, tgt0 = encode_ids(tok_src, pairs[0][0]), encode_ids(tok_tgt, pairs[0][1])
    src1, tgt1 = encode_ids(tok_src, pairs[1][0]), encode_ids(tok_tgt, pairs[1][1])
    assert batch["encoder_input"].shape == (2, len(src1) + 2)  # not seq_len
    assert batch["decoder_input"].shape == batch["label"].shape == (2, len(tgt1) + 1)
    assert batch["encoder_input"][0].tolist() == [SOS_ID, *src0, EOS_ID] + [PAD_ID] * (len(src1) - len(src0))
    assert batch["decoder_input"][0].tolist() == [SOS_ID, *tgt0] + [PAD_ID] * (len(tgt1) - len(tgt0))
    assert batch["label"][0].tolist() == [*tgt0, EOS_ID] + [PAD_ID] * (len(tgt1) - len(tgt0))
    assert batch["encoder_input"][1].tolist() == [SOS_ID, *src1, EOS_ID]
    assert batch["label"][1].tolist() == [*tgt1, EOS_ID]
    alone = dataset.collate([0])
    assert alone["encoder_input"].shape == (1, len(src0) + 2)


def test_masks_have_the_tutorial_shapes_are_causal_and_hide_padding(tokenizers) -> None:
    tok_src, tok_tgt = tokenizers
    pairs = synthetic_pairs(6, 4)
    dataset = BilingualDataset(pairs, tok_src, tok_tgt, seq_len=64)
    batch = dataset.collate(list(range(len(pairs))))
    b, s = batch["encoder_input"].shape
    t = batch["decoder_input"].size(1)
    src_mask, tgt_mask = batch["src_mask"], batch["tgt_mask"]
    assert src_mask.shape == (b, 1, 1, s) and tgt_mask.shape == (b, 1, t, t)
    assert src_mask.dtype == tgt_mask.dtype == torch.bool
    assert torch.equal(src_mask[:, 0, 0], batch["encoder_input"] != PAD_ID)
    for row in range(b):
        length = int(dataset.tgt_lens[row])
        for i in range(t):
            for j in range(t):
                # may attend exactly to real positions at or before its own
                assert bool(tgt_mask[row, 0, i, j]) == (j <= i and j < length), (row, i, j)
    assert not tgt_mask.triu(diagonal=1).any()


# ---------------------------------------------------------------------------- batching

def tatoeba_like_lengths(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (with special tokens) shaped like tatoeba's: English median 9, Italian a little
    shorter and strongly correlated, a long tail up to 100."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.round(rng.lognormal(np.log(9), 0.35, count)), 4, 100).astype(np.int64)
    tgt = np.clip(np.round(src * rng.normal(0.85, 0.12, count)), 3, 100).astype(np.int64)
    return src, tgt


@pytest.mark.parametrize("budget", [256, 1000, 4096])
def test_token_batches_respect_the_budget_and_cover_everything_once(budget: int) -> None:
    src, tgt = tatoeba_like_lengths(3000)
    src[:3] = 300  # longer than the smallest budget: each gets a batch of its own
    batches = token_batches(src, tgt, budget, np.random.default_rng(0))
    covered = np.concatenate(batches)
    assert sorted(covered.tolist()) == list(range(len(src)))
    for batch in batches:
        padded = len(batch) * int(np.maximum(src[batch], tgt[batch]).max())
        assert padded <= budget or len(batch) == 1
    assert sum(len(b) == 1 for b in batches) >= (3 if budget < 300 else 0)


@pytest.mark.parametrize("budget", [512, 3000, 4096])
def test_padding_waste_is_under_ten_percent_on_tatoeba_like_lengths(budget: int) -> None:
    src, tgt = tatoeba_like_lengths(15000)
    batches = token_batches(src, tgt, budget, np.random.default_rng(0))
    waste = padding_waste(batches, src, tgt)
    assert waste < 0.10, f"{waste:.1%} padding"
    # what padding every batch to the longest sentence of the corpus would waste, for scale
    naive = padding_waste([np.arange(len(src))], src, tgt)
    assert naive > 0.5


def test_padding_waste_counts_padded_positions() -> None:
    src, tgt = np.array([4, 6]), np.array([3, 5])
    assert padding_waste([np.array([0, 1])], src, tgt) == pytest.approx(1 - 18 / 22)
    assert padding_waste([np.array([0]), np.array([1])], src, tgt) == 0.0


@pytest.fixture(scope="module")
def plan_dataset(tokenizers) -> BilingualDataset:
    tok_src, tok_tgt = tokenizers
    return BilingualDataset(synthetic_pairs(400, 5), tok_src, tok_tgt, seq_len=64)


def as_lists(plan: list) -> list:
    return [(b.tolist(), tokens) for b, tokens in plan]


def test_batch_plan_order_is_a_function_of_seed_and_epoch(plan_dataset: BilingualDataset) -> None:
    plan = BatchPlan(plan_dataset, batch_tokens=200, seed=3)
    assert as_lists(plan.micro_batches(0)) == as_lists(BatchPlan(plan_dataset, 200, seed=3).micro_batches(0))
    assert as_lists(plan.micro_batches(0)) != as_lists(plan.micro_batches(1))
    assert as_lists(plan.micro_batches(0)) != as_lists(BatchPlan(plan_dataset, 200, seed=4).micro_batches(0))
    assert plan.steps_per_epoch(0) == len(plan.micro_batches(0)) > 10


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_share_each_step_disjointly(plan_dataset: BilingualDataset, world_size: int) -> None:
    single = BatchPlan(plan_dataset, 200, seed=3, accum_steps=world_size)  # one process, same global step
    ranks = [BatchPlan(plan_dataset, 200, seed=3, world_size=world_size, rank=r) for r in range(world_size)]
    plans = [r.micro_batches(2) for r in ranks]
    assert len({len(p) for p in plans}) == 1 and all(r.steps_per_epoch(2) == single.steps_per_epoch(2) for r in ranks)
    steps = single.steps_per_epoch(2)
    full = single.micro_batches(2)
    for step in range(steps):
        from_ranks = [plans[r][step] for r in range(world_size)]
        expected = full[step * world_size:(step + 1) * world_size]
        assert sorted(tuple(b.tolist()) for b, _ in from_ranks) == sorted(tuple(b.tolist()) for b, _ in expected)
        # every rank normalises by the tokens of the whole global step
        assert {tokens for _, tokens in from_ranks} == {int(sum(plan_dataset.tgt_lens[b].sum() for b, _ in expected))}
    sentences = [i for p in plans for b, _ in p for i in b.tolist()]
    assert len(sentences) == len(set(sentences))  # disjoint
    whole = BatchPlan(plan_dataset, 200, seed=3).micro_batches(2)
    used = {i for b, _ in whole[:steps * world_size] for i in b.tolist()}
    assert set(sentences) == used


def test_micro_batches_from_a_step_are_the_tail_of_the_epoch(plan_dataset: BilingualDataset) -> None:
    for world_size, accum in ((1, 1), (1, 2), (2, 2)):
        plan = BatchPlan(plan_dataset, 200, seed=3, world_size=world_size, rank=world_size - 1, accum_steps=accum)
        full = as_lists(plan.micro_batches(1))
        for start in (0, 1, 3, plan.steps_per_epoch(1)):
            assert as_lists(plan.micro_batches(1, start)) == full[start * accum:]


def test_micro_batches_dataset_yields_collated_batches(plan_dataset: BilingualDataset) -> None:
    plan = BatchPlan(plan_dataset, 200, seed=3, accum_steps=2)
    micro = MicroBatches(plan_dataset, plan.micro_batches(0))
    item = micro[0]
    indices, step_tokens = plan.micro_batches(0)[0]
    assert torch.equal(item["encoder_input"], plan_dataset.collate(indices)["encoder_input"])
    assert int(item["num_tokens"]) == int((item["label"] != PAD_ID).sum())
    assert int(item["step_tokens"]) == step_tokens >= int(item["num_tokens"])


# ---------------------------------------------------------------------------- real data

@pytest.mark.skipif(not (SHARED_DATA / "tatoeba").is_dir(), reason="../shared/data/tatoeba is absent")
def test_tatoeba_loads_whole_and_deterministically(tmp_path: Path) -> None:
    folder = SHARED_DATA / "tatoeba"
    usable = {}
    for split, size in (("train", 15359), ("validation", 679), ("test", 1282)):
        rows = [json.loads(line) for line in (folder / "en-it" / f"{split}.jsonl").read_text("utf-8").splitlines()]
        assert len(rows) == size
        usable[split] = sum(isinstance(r["translation"].get("en"), str) and isinstance(r["translation"].get("it"), str)
                            and bool(r["translation"]["en"].strip()) and bool(r["translation"]["it"].strip())
                            for r in rows)
    config = {**get_config(), "datasource": str(folder), "min_frequency": 2}
    splits = load_splits(config)
    assert {name: len(pairs) for name, pairs in splits.items()} == usable
    assert load_splits(config) == splits
    # the real lengths, batched as the cpu preset does, waste little on padding
    tok_src, tok_tgt = train_tokenizers(config, lambda: iter(splits["train"]))
    dataset = BilingualDataset(splits["train"], tok_src, tok_tgt, seq_len=128)
    for budget in (512, 3000, 4096):
        batches = token_batches(dataset.src_lens, dataset.tgt_lens, budget, np.random.default_rng(0))
        assert padding_waste(batches, dataset.src_lens, dataset.tgt_lens) < 0.10
