"""store.py: the text and token stores are built once and reused without reading the datasource
again; carving, held-out overlap and filters are applied and counted; tokenizers see a capped, seeded
sample of train only; ids use the smallest type and are memory-mapped; a damaged or half-built store
is rebuilt with one line; another tokenizer, setting or datasource never gets a stale store. Builds
in other processes (forked, so that they start in milliseconds): two builds of one store at once
both succeed with one store, a live builder's temporary folder survives every other build and a
dead one's is removed, a reader never deletes, and a full disk (RLIMIT_FSIZE) is one line that
leaves no store behind and the other stores as they were. A store that cannot be read (EIO) is one
line and is never deleted; a store_folder or lock file that cannot be written is one line."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import resource
import shutil
import signal
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from nmt.corpora import sources
from nmt.corpora import store
import train
from config import get_config
from nmt.corpora.file_digests import FILE
from nmt.corpora.sources import DataError
from nmt.corpora.store import TextStore, text_store, token_store, tokenizer_sample
from synthetic_data import synthetic_pairs, write_hub_dataset, write_parallel_files
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, UNK_ID, encode_ids, train_tokenizers


def numbered_pairs(count: int, prefix: str = "w") -> list[tuple[str, str]]:
    """Pairs that each carry a word of their own, so leakage of any row is visible."""
    return [(f"The word {prefix}{i} is here.", f"La parola {prefix}{i} è qui.") for i in range(count)]


def config_for(folder: Path, tmp_path: Path, **overrides) -> dict:
    return {**get_config(), "datasource": str(folder), "min_frequency": 1, "seq_len": 32,
            "store_folder": str(tmp_path / "stores"), **overrides}


@pytest.fixture
def train_only(tmp_path: Path) -> Path:
    return write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(200)})


# ---------------------------------------------------------------------------- the text store

def test_a_train_only_source_is_carved_once_by_seed(train_only: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    store = text_store(config_for(train_only, tmp_path, seed=1))
    assert "split the train split with seed 1 into train 180, validation 10, test 10" in capsys.readouterr().err
    parts = {name: store.pairs(name) for name in store.splits()}
    assert sorted(sum(parts.values(), [])) == sorted(numbered_pairs(200))  # a partition
    again = text_store(config_for(train_only, tmp_path, seed=1))
    assert again.folder == store.folder and again.pairs("validation") == parts["validation"]
    assert "building" not in capsys.readouterr().err
    other = text_store(config_for(train_only, tmp_path, seed=2))
    assert other.folder != store.folder and other.pairs("validation") != parts["validation"]
    capped = text_store(config_for(train_only, tmp_path, seed=1, val_fraction=0.2, val_max_pairs=7))
    assert (capped.size("train"), capped.size("validation"), capped.size("test")) == (183, 7, 10)


def test_rows_in_any_order_read_the_same_pairs(train_only: Path, tmp_path: Path) -> None:
    """Rows in corpus order are read in one block, rows out of order one by one: the same pairs."""
    store = text_store(config_for(train_only, tmp_path))
    in_order = store.pairs("train", range(0, 40))
    assert in_order == sorted(in_order, key=numbered_pairs(200).index)  # corpus order
    assert store.pairs("train", range(39, -1, -1)) == in_order[::-1]
    assert store.pairs("train", [5, 0, 5]) == [in_order[5], in_order[0], in_order[5]]


def test_a_missing_test_split_is_carved_from_train_only(tmp_path: Path) -> None:
    validation = numbered_pairs(5, "v")
    folder = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(100), "validation": validation})
    store = text_store(config_for(folder, tmp_path))
    assert store.pairs("validation") == validation
    assert store.size("test") == 5 and store.size("train") == 95
    assert not set(store.pairs("test")) & set(store.pairs("train"))


def test_held_out_source_sentences_leave_train(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """opus_books repeats sentences: a carved-out sentence's twins must not stay in train."""
    pairs = [(f"Sentence {i % 50}.", f"Frase {i}.") for i in range(400)]
    folder = write_hub_dataset(tmp_path / "data", {"train": pairs})
    store = text_store(config_for(folder, tmp_path, val_fraction=0.05, test_fraction=0.05))
    held_out = {s for s, _ in store.pairs("validation") + store.pairs("test")}
    train_sources = {s for s, _ in store.pairs("train")}
    assert held_out and not held_out & train_sources
    removed = 360 - store.size("train")
    assert removed > 0 and f"removed {removed} training pairs" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["train only", "three splits"])
def test_tokenizers_never_see_validation_or_test(tmp_path: Path, source: str) -> None:
    if source == "train only":
        folder = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(200)})  # 5% + 5% held out
    else:
        folder = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(80), "validation": numbered_pairs(
            10, "v"), "test": numbered_pairs(10, "t")})
    config = config_for(folder, tmp_path)
    store = text_store(config)
    tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, [store]))
    held_out = {s.split()[2] for s, _ in store.pairs("validation") + store.pairs("test")}
    assert len(held_out) == 20
    for word in held_out:
        assert encode_ids(tok_src, word) == [UNK_ID] and encode_ids(tok_tgt, word) == [UNK_ID]
    for source_text, _ in store.pairs("train")[:5]:
        assert UNK_ID not in encode_ids(tok_src, source_text)


def test_tokenizer_sample_is_capped_and_seeded(train_only: Path, tmp_path: Path) -> None:
    config = config_for(train_only, tmp_path, tokenizer_max_sentences=40)
    store = text_store(config)
    sample = list(tokenizer_sample(config, [store]))
    assert len(sample) == 40 and len(set(sample)) == 40 and set(sample) <= set(store.pairs("train"))
    assert list(tokenizer_sample(config, [store])) == sample
    assert list(tokenizer_sample({**config, "seed": 7}, [store])) != sample
    assert len(list(tokenizer_sample({**config, "tokenizer_max_sentences": 10_000}, [store]))) == store.size("train")


def test_filters_are_off_by_default_and_counted_when_on(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pairs = synthetic_pairs(100, 1)
    noisy = pairs + pairs[:30] + [("Yes.", "Sì " * 20 + "."), ("No.", "No.")]
    folder = write_hub_dataset(tmp_path / "data", {"train": noisy, "validation": pairs[:5], "test": pairs[:5]})
    plain = text_store(config_for(folder, tmp_path, clean=False))  # cleaning's rules would remove those too
    assert plain.size("train") == 132
    assert "filter_" not in capsys.readouterr().err
    config = config_for(folder, tmp_path, filter_duplicates=True, filter_max_length_ratio=3.0, clean=False)
    deduplicated = text_store(config)
    unique = len(set(noisy))
    assert deduplicated.size("train") == unique
    assert f"filter_duplicates: dropped {132 - unique} of 132 training pairs" in capsys.readouterr().err
    tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, [deduplicated]))
    tokens = token_store(config, deduplicated, tok_src, tok_tgt)
    assert len(tokens.dataset("train")) == unique - 1  # "Yes." -> 21 tokens is dropped
    assert "filter_max_length_ratio: dropped 1 training pairs" in capsys.readouterr().err
    assert len(token_store({**config, "filter_max_length_ratio": 0.0}, deduplicated, tok_src, tok_tgt)
               .dataset("train")) == unique


# ---------------------------------------------------------------------------- cleaning

NOISE = [("Tom is here.", "Tom is here."),  # copy
         ("La stazione è dall'altra parte del fiume.", "Il treno parte alle nove di sera."),  # language
         ("The word w3 is here!", "La parola w3 è qui!"),  # a near-duplicate of row 3
         ("The word café is here.", "La parola caffe\u0300 è qui."),  # kept, NFC-normalised
         ("Il treno parte alle nove di sera, ma io resto a casa.",
          "The train leaves at nine in the evening, but I stay at home.")]  # kept, its sides swapped back


def test_cleaning_removes_training_pairs_by_reason_and_keeps_the_report(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """Only train is cleaned, kept pairs NFC-normalised and swapped sides put back; the counts and samples (rows numbered as the
    corpus's training pairs) are logged in one line and written beside the store, and read back when
    it is reused; --clean false and every setting have stores of their own."""
    train = numbered_pairs(40) + NOISE
    held_out = [NOISE[0], *numbered_pairs(3, "v")]  # the held-out splits are never cleaned
    folder = write_hub_dataset(tmp_path / "data", {"train": train, "validation": held_out, "test": held_out})
    cleaned = text_store(config_for(folder, tmp_path))
    line = "data: cleaning en-it: kept 42 of 45 pairs, removed 3 (1 copy, 1 language, 1 near_duplicate), " \
           "sides swapped 1, NFC-normalised 1"
    assert line in capsys.readouterr().err.splitlines()
    assert cleaned.pairs("train") == numbered_pairs(40) + [("The word café is here.", "La parola caffè è qui."),
                                                           (NOISE[4][1], NOISE[4][0])]
    assert cleaned.pairs("validation") == cleaned.pairs("test") == held_out
    report = json.loads((cleaned.folder / store.CLEANING_FILE).read_text(encoding="utf-8"))
    assert report == cleaned.cleaning() and report["scoring"] is None
    assert report["rules"]["removed"] == {"copy": 1, "language": 1, "near_duplicate": 1}
    assert {reason: [(sample["row"], sample["source"]) for sample in samples]
            for reason, samples in report["rules"]["samples"].items()} == \
        {"copy": [(40, NOISE[0][0])], "language": [(41, NOISE[1][0])], "near_duplicate": [(42, NOISE[2][0])],
         "swapped": [(44, NOISE[4][0])]}
    assert text_store(config_for(folder, tmp_path)).folder == cleaned.folder
    assert "building" not in (err := capsys.readouterr().err) and line in err.splitlines()
    plain = text_store(config_for(folder, tmp_path, clean=False))
    assert plain.folder != cleaned.folder and plain.pairs("train") == train and plain.cleaning() is None
    assert text_store(config_for(folder, tmp_path, clean_near_duplicates=False)).size("train") == 43


def test_carving_is_the_same_with_cleaning_on_or_off(tmp_path: Path) -> None:
    pairs = numbered_pairs(200)
    folder = write_hub_dataset(tmp_path / "data", {"train": pairs[:100] + NOISE + pairs[100:]})
    cleaned, plain = (text_store(config_for(folder, tmp_path, clean=clean)) for clean in (True, False))
    for split in ("validation", "test"):
        assert cleaned.pairs(split) == plain.pairs(split)
    removed = set(plain.pairs("train")) - set(cleaned.pairs("train"))
    assert removed and removed <= set(NOISE)


def by_word_number(pairs: list[tuple[str, str]], lang_src: str, lang_tgt: str) -> np.ndarray:
    """A scorer of numbered_pairs: the higher a pair's number, the worse its score."""
    assert (lang_src, lang_tgt) == ("en", "it")
    return np.array([float(source.split()[2].lstrip("w")) for source, _ in pairs])


def test_model_scoring_keeps_the_best_share_and_is_keyed_by_the_models_content(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The store keeps the best clean_score_keep share by the scores of the scorer its builder
    hands it, asks it nothing when it opens a built store, and is keyed by the models' content."""
    train = numbered_pairs(30)[::-1]
    folder = write_hub_dataset(tmp_path / "data", {"train": train, "validation": train[:2], "test": train[:2]})
    forward, backward = tmp_path / "forward" / "ckpt.pt", tmp_path / "backward.pt"
    forward.parent.mkdir()
    forward.write_bytes(b"a model en-it")
    backward.write_bytes(b"a model it-en")
    config = config_for(folder, tmp_path, clean_score_forward=str(forward), clean_score_backward=str(backward),
                        clean_score_keep=0.3, clean_samples=2)
    scored = text_store(config, scorer=by_word_number)
    assert scored.pairs("train") == train[-9:]  # 9 of 30, the pairs numbered 0 to 8, in the corpus's order
    report = scored.cleaning()["scoring"]
    assert (report["scored"], report["kept"], report["cut"], [sample["row"] for sample in report["worst"]]) == \
        (30, 9, 8.0, [0, 1])
    assert "scoring by dual conditional cross-entropy kept the best 9 of 30 (30%)" in capsys.readouterr().err

    def never(*_: object) -> np.ndarray:
        raise AssertionError("a built store was scored again")

    assert text_store(config, scorer=never).folder == scored.folder
    copy = tmp_path / "copy" / forward.name
    copy.parent.mkdir()
    shutil.copy(forward, copy)
    assert text_store({**config, "clean_score_forward": str(copy)}, scorer=never).folder == scored.folder
    retrained = tmp_path / "retrained.pt"
    retrained.write_bytes(b"a model en-it, trained further")
    assert text_store({**config, "clean_score_forward": str(retrained)}, scorer=by_word_number).folder != \
        scored.folder


def test_a_scorer_of_other_languages_or_none_is_one_line(tmp_path: Path) -> None:
    folder = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(30)})
    model = tmp_path / "model.pt"
    model.write_bytes(b"a model")
    config = config_for(folder, tmp_path, clean_score_forward=str(model), clean_score_backward=str(model))

    def other_languages(*_: object) -> np.ndarray:
        raise ValueError("the forward model translates it into en, not en into it")

    with pytest.raises(DataError, match=rf"^cannot score '{folder}' with --clean_score_forward and "
                                        rf"--clean_score_backward: the forward model translates it into en"):
        text_store(config, scorer=other_languages)
    with pytest.raises(DataError, match=rf"^--clean_score_forward asks to score the training pairs of '{folder}', "
                                        rf"but the program building its data store gave it no scorer"):
        text_store(config)
    assert [path.suffix for path in Path(config["store_folder"]).iterdir() if path.name != FILE] == [".lock"], \
        "no store of pairs that were not scored"


# ---------------------------------------------------------------------------- the token store

@pytest.fixture
def built(train_only: Path, tmp_path: Path):
    config = config_for(train_only, tmp_path)
    text = text_store(config)
    tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, [text]))
    return config, text, tok_src, tok_tgt, token_store(config, text, tok_src, tok_tgt)


def test_special_tokens_typed_in_training_pairs_are_stored_as_text(tmp_path: Path) -> None:
    """A pair whose text holds [EOS], [PAD], [SOS] or a tag (<BT> is reserved by default) gets none
    of their ids: only the tagged corpus's own tag, first in each source row, is a control id."""
    pairs = [(f"The word w{i} [EOS] is [PAD] <BT> here.", f"La parola [SOS] w{i} <BT> è qui [EOS].") for i in range(60)]
    folder = write_hub_dataset(tmp_path / "data", {"train": pairs})
    config = config_for(folder, tmp_path, datasource=f"{folder}:1:<BT>")
    [text] = store.text_stores(config)
    tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, [text]))
    tag = tok_src.token_to_id("<BT>")
    controls = {tag, PAD_ID, SOS_ID, EOS_ID}
    rows = token_store(config, text, tok_src, tok_tgt, store.corpora(config)[0]).dataset("train")
    for row in range(len(rows)):
        src, tgt = (ids.tolist() for ids in rows[row])
        assert src[0] == tag and not controls & set(src[1:]) and not controls & set(tgt)


def test_rows_are_the_pairs_token_ids_memory_mapped_in_the_smallest_type(built, tmp_path: Path) -> None:
    config, text, tok_src, tok_tgt, tokens = built
    assert tok_tgt.get_vocab_size() <= 256 and tokens.meta["dtype"] == "uint8"
    train = tokens.dataset("train")
    assert isinstance(train.src_ids, np.memmap) and train.src_ids.dtype == np.uint8
    assert len(train) == text.size("train")
    for row, (source, target) in zip([0, 7, 179], text.pairs("train", [0, 7, 179])):
        src, tgt = train[row]
        assert src.tolist() == encode_ids(tok_src, source) and tgt.tolist() == encode_ids(tok_tgt, target)
    larger = {**config, "datasource": str(write_hub_dataset(tmp_path / "larger", {"train": numbered_pairs(400)}))}
    larger_text = text_store(larger)
    larger_tokenizers = train_tokenizers(larger, lambda: tokenizer_sample(larger, [larger_text]))
    assert larger_tokenizers[1].get_vocab_size() > 256
    wide = token_store(larger, larger_text, *larger_tokenizers)
    assert wide.meta["dtype"] == "uint16" and wide.dataset("train").tgt_ids.dtype == np.uint16


def test_pairs_too_long_are_dropped_and_counted(built, capsys: pytest.CaptureFixture) -> None:
    config, text, tok_src, tok_tgt, _ = built
    tokens = token_store({**config, "seq_len": 7}, text, tok_src, tok_tgt)  # "The word wN is here." is 6 + 2
    assert len(tokens.dataset("train")) == 0
    assert f"train: dropped {text.size('train')} of {text.size('train')} pairs longer than seq_len 7" \
        in capsys.readouterr().err


def test_stores_are_reused_without_reading_or_tokenizing_again(built, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    config, text, tok_src, tok_tgt, tokens = built

    def no_reading(self, split):
        raise AssertionError("the datasource was read again")

    def no_tokenizing(*args):
        raise AssertionError("the pairs were tokenized again")

    monkeypatch.setattr(sources.Source, "rows", no_reading)
    monkeypatch.setattr(store, "_fill_token_store", no_tokenizing)
    capsys.readouterr()
    again = token_store(config, text_store(config), tok_src, tok_tgt)
    assert again.folder == tokens.folder
    assert "building" not in capsys.readouterr().err


def test_another_tokenizer_datasource_or_seq_len_gets_another_store(built, tmp_path: Path) -> None:
    config, text, tok_src, tok_tgt, tokens = built
    other_tokenizers = train_tokenizers({**config, "tokenizer_type": "bpe", "vocab_size": 60},
                                        lambda: tokenizer_sample(config, [text]))
    assert token_store(config, text, *other_tokenizers).folder != tokens.folder
    assert token_store({**config, "seq_len": 64}, text, tok_src, tok_tgt).folder != tokens.folder
    write_hub_dataset(Path(config["datasource"]), {"train": numbered_pairs(150)})  # the data changed
    changed = text_store(config)
    assert changed.folder != text.folder and changed.size("train") + changed.size("validation") \
        + changed.size("test") == 150


def test_a_damaged_store_is_rebuilt_with_one_line(built, capsys: pytest.CaptureFixture) -> None:
    config, text, tok_src, tok_tgt, tokens = built
    expected = [ids.tolist() for ids in tokens.dataset("train")[5]]
    damaged = tokens.folder / "train.src.bin"
    data = bytearray(damaged.read_bytes())
    data[10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    rebuilt = token_store(config, text, tok_src, tok_tgt)
    lines = [line for line in capsys.readouterr().err.splitlines() if " is damaged (" in line]
    assert len(lines) == 1 and "train.src.bin does not match its sha256" in lines[0]
    assert [ids.tolist() for ids in rebuilt.dataset("train")[5]] == expected
    (text.folder / "meta.json").unlink()  # a text store cut short
    assert text_store(config).pairs("validation") == text.pairs("validation")
    assert " is damaged (" in capsys.readouterr().err


def test_a_half_built_store_is_never_used_and_is_cleared(train_only: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_for(train_only, tmp_path)
    stores = Path(config["store_folder"])
    original = sources.Source.rows

    def dies_halfway(self, split):
        yield next(original(self, split))
        raise KeyboardInterrupt

    monkeypatch.setattr(sources.Source, "rows", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        text_store(config)
    assert [p.suffix for p in stores.iterdir()] == [".lock"], "an interrupted build leaves only its lock file"
    monkeypatch.setattr(sources.Source, "rows", original)
    built = text_store(config)
    shutil.rmtree(built.folder)
    leftover = built.folder.with_name(f".{built.folder.name}.tmp99")  # what a build killed by SIGKILL leaves
    leftover.mkdir()
    (leftover / "raw-train.src.bin").write_bytes(b"partial")
    rebuilt = text_store(config)
    assert [p.name for p in stores.iterdir() if p.suffix != ".lock"] == [rebuilt.folder.name]
    assert rebuilt.pairs("train") == built.pairs("train")


# ---------------------------------------------------------------------------- other processes

FORK = multiprocessing.get_context("fork")  # a child with the modules already imported


@pytest.fixture
def fork():
    """Start a forked child running `target(*args)`; any still running when the test ends is killed."""
    started: list[multiprocessing.Process] = []

    def start(target: Callable, *args) -> multiprocessing.Process:
        child = FORK.Process(target=target, args=args)
        child.start()
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        child.join(5)


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def build_in_child(config: dict, signals: Path, hold: bool) -> None:
    """A child process's text_store(config), leaving a file in `signals` when it asks for the build
    lock (`locking-PID`), when it fills its temporary folder (`filling-PID`, then waiting for a `go`
    file if `hold`), and when it has its store (`done-PID`, holding the folder)."""
    original_lock, original_fill = store.build_lock, store._fill_text_store

    def announced_lock(folder: Path):
        (signals / f"locking-{os.getpid()}").touch()
        return original_lock(folder)

    def held_fill(temporary: Path, *args, **kwargs):
        (signals / f"filling-{os.getpid()}").touch()
        if hold:
            wait_for((signals / "go").exists)
        return original_fill(temporary, *args, **kwargs)

    store.build_lock, store._fill_text_store = announced_lock, held_fill
    try:
        (signals / f"done-{os.getpid()}").write_text(str(text_store(config).folder))
    except BaseException:
        (signals / f"failed-{os.getpid()}").write_text(traceback.format_exc())
        os._exit(1)


def start_builds(fork, config: dict, tmp_path: Path) -> tuple[Path, multiprocessing.Process, multiprocessing.Process]:
    """A first build held inside its fill, and a second build of the same store started meanwhile,
    given half a second to do what it would do without the lock (start filling); neither did."""
    signals = tmp_path / "signals"
    signals.mkdir()
    first = fork(build_in_child, config, signals, True)
    assert wait_for((signals / f"filling-{first.pid}").exists)
    second = fork(build_in_child, config, signals, False)
    assert wait_for((signals / f"locking-{second.pid}").exists)
    assert not wait_for((signals / f"filling-{second.pid}").exists, timeout=0.5), "the second build did not wait"
    return signals, first, second


def test_two_builds_of_one_store_at_once_both_succeed_with_one_store(fork, train_only: Path, tmp_path: Path,
                                                                    capfd: pytest.CaptureFixture) -> None:
    config = config_for(train_only, tmp_path)
    stores = Path(config["store_folder"])
    signals, first, second = start_builds(fork, config, tmp_path)
    temporaries = list(stores.glob(".*.tmp*"))
    assert [p.name.rsplit(".tmp", 1)[1] for p in temporaries] == [str(first.pid)]
    other = text_store({**config, "seed": 2})  # another store built meanwhile, in this process
    assert all(p.is_dir() for p in temporaries), "the first build's temporary folder survives the others"
    (signals / "go").touch()
    for child in (first, second):
        child.join(60)
        assert child.exitcode == 0, (signals / f"failed-{child.pid}").read_text()
    folders = {(signals / f"done-{child.pid}").read_text() for child in (first, second)}
    assert len(folders) == 1 and not (signals / f"filling-{second.pid}").exists(), "the second opened the first's"
    built = TextStore.open(Path(folders.pop()))
    assert f"waiting for process {first.pid}, which is building the data store {built.folder}" in capfd.readouterr().err
    assert sorted(sum((built.pairs(name) for name in built.splits()), [])) == sorted(numbered_pairs(200))
    assert sorted(p.name for p in stores.iterdir() if p.suffix != ".lock") == sorted([built.folder.name,
                                                                                       other.folder.name])


def test_a_dead_builders_leftover_is_removed_by_the_build_that_waited(fork, train_only: Path, tmp_path: Path) -> None:
    config = config_for(train_only, tmp_path)
    stores = Path(config["store_folder"])
    signals, first, second = start_builds(fork, config, tmp_path)
    leftover = next(stores.glob(".*.tmp*"))
    os.kill(first.pid, signal.SIGKILL)  # the kernel drops its lock; its temporary folder stays
    second.join(60)
    assert second.exitcode == 0, (signals / f"failed-{second.pid}").read_text()
    assert (signals / f"filling-{second.pid}").exists() and not leftover.exists()
    assert [p.name for p in stores.iterdir() if p.suffix != ".lock"] == [Path((signals / f"done-{second.pid}")
                                                                          .read_text()).name]


def test_a_reader_never_deletes_a_damaged_store(train_only: Path, tmp_path: Path) -> None:
    """Store.open is what the ranks that wait for rank 0 call (train.py, verify=False)."""
    built = text_store(config_for(train_only, tmp_path))
    damaged = built.folder / "raw-train.src.bin"
    damaged.write_bytes(damaged.read_bytes()[:-1])
    files = {p.name: p.read_bytes() for p in built.folder.iterdir()}
    for verify in (False, True):
        with pytest.raises(sources.DataError, match=r"is damaged \(raw-train\.src\.bin has \d+ bytes"):
            TextStore.open(built.folder, verify=verify)
    assert {p.name: p.read_bytes() for p in built.folder.iterdir()} == files
    with pytest.raises(sources.DataError, match="does not exist"):
        TextStore.open(built.folder.with_name("nowhere"), verify=False)


def build_with_file_size_limit(config: dict, limit: int, report: Path) -> None:
    """A child process's text_store(config) with files capped at `limit` bytes: a write past it fails
    with EFBIG, as on a full disk (SIGXFSZ ignored, or it would kill the process instead)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        text_store(config)
    except sources.DataError as error:  # what train.py prints as one line, with exit 1
        report.write_text(str(error))
        os._exit(1)
    except BaseException:
        report.write_text(traceback.format_exc())
        os._exit(2)
    os._exit(0)


def test_a_full_disk_during_a_build_is_one_line_and_keeps_the_other_stores(fork, tmp_path: Path) -> None:
    data = write_hub_dataset(tmp_path / "data", {"train": numbered_pairs(4000)})  # 92 KB of source text
    config = config_for(data, tmp_path, seed=1)
    good = text_store(config)
    stores = Path(config["store_folder"])
    before = {p.name: p.read_bytes() for p in good.folder.iterdir()}
    child = fork(build_with_file_size_limit, {**config, "seed": 2}, 40_000, tmp_path / "report")
    child.join(60)
    message = (tmp_path / "report").read_text()
    assert child.exitcode == 1, message
    assert len(message.splitlines()) == 1 and "File too large" in message
    built = [p for p in stores.iterdir() if p.suffix != ".lock" and p.name != FILE]  # FILE: not a store
    assert built == [good.folder], "no store and no temporary folder of the failed build is left"
    assert f"cannot write the data store {stores}{os.sep}" in message and good.folder.name not in message
    assert {p.name: p.read_bytes() for p in good.folder.iterdir()} == before
    assert TextStore.open(good.folder).pairs("validation") == good.pairs("validation")


# ---------------------------------------------------------------------------- errors that are not damage

def test_a_store_that_cannot_be_read_is_one_line_and_never_deleted(train_only: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """EIO (or EACCES, EMFILE...) while checking a store says nothing about the store: neither the
    builder nor a reader replaces it for that. A store truly damaged whose removal fails is one line."""
    config = config_for(train_only, tmp_path)
    built = text_store(config)
    files = {p.name: p.read_bytes() for p in built.folder.iterdir()}

    def failing_read(path: Path) -> str:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    with monkeypatch.context() as patch:
        patch.setattr(store, "sha256_of", failing_read)
        for opening in (lambda: text_store(config), lambda: TextStore.open(built.folder)):
            with pytest.raises(sources.DataError, match=f"cannot read the data store {built.folder}: Input/output "
                                                        f"error: {built.folder}{os.sep}"):
                opening()
    assert {p.name: p.read_bytes() for p in built.folder.iterdir()} == files
    assert "damaged" not in capsys.readouterr().err

    (built.folder / "raw-train.src.bin").write_bytes(b"damaged")

    def refused(path: Path, *args, **kwargs) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(store.shutil, "rmtree", refused)
    with pytest.raises(sources.DataError) as error:
        text_store(config)
    assert str(error.value) == (f"data store {built.folder} is damaged (raw-train.src.bin has 7 bytes, not "
                                f"{len(files['raw-train.src.bin'])}) and cannot be removed: Permission denied: "
                                f"{built.folder}")


def test_a_store_folder_that_cannot_be_written_is_one_line(train_only: Path, tmp_path: Path, capsys) -> None:
    """Not only a full disk: a store_folder under a plain file, a lock file that is a folder, a
    read-only folder are each one line from train.py, and nothing is written or removed."""
    plain = tmp_path / "afile"
    plain.write_text("mine\n")
    code = train.main(["--datasource", str(train_only), "--preset", "tiny", "--store_folder", str(plain / "stores"),
                       "--model_folder", str(tmp_path / "weights"), "--runs_folder", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith(f"train.py: error: cannot write the data store {plain}{os.sep}stores")
    assert "Traceback" not in "\n".join(err) and err[-1].endswith(f"Not a directory: {plain / 'stores'}")
    assert plain.read_text() == "mine\n"

    config = config_for(train_only, tmp_path)
    folder = text_store(config).folder
    shutil.rmtree(folder)
    lock = folder.with_name(f".{folder.name}.lock")
    lock.unlink()
    lock.mkdir()
    with pytest.raises(sources.DataError, match=f"cannot write the data store {folder}: Is a directory: {lock}$"):
        text_store(config)
    if os.geteuid() == 0:
        return  # root writes into a read-only folder
    shutil.rmtree(Path(config["store_folder"]))
    Path(config["store_folder"]).mkdir(mode=0o555)
    with pytest.raises(sources.DataError, match=f"cannot write the data store {folder}: Permission denied"):
        text_store(config)
    assert not any(Path(config["store_folder"]).iterdir())


def test_eval_pairs_reads_a_file_given_apart_a_corpus_split_or_the_carved_one(tmp_path: Path) -> None:
    """What evaluate.py scores: --test_data (here a TSV file) as the test split; a split the
    datasource has as it is; and a split it lacks as the one training carved (the text store's)."""
    pairs = synthetic_pairs(40, 5)
    tsv = tmp_path / "news.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:7]), encoding="utf-8")
    data = write_hub_dataset(tmp_path / "data", {"train": pairs, "validation": pairs[:5]})
    config = dict(get_config(), datasource=str(data), store_folder=str(tmp_path / "stores"), seed=3)
    assert store.eval_pairs(dict(config, test_data=str(tsv)), "test", config) == pairs[:7]
    assert store.eval_pairs(config, "validation", config) == pairs[:5]
    carved = store.eval_pairs(config, "test", config)
    assert carved == text_store(config).pairs("test") and carved and set(carved) <= set(pairs)
    with pytest.raises(sources.DataError, match="no 'dev' split"):
        store.eval_pairs(config, "dev", config)
    model = tmp_path / "model.pt"  # a model trained on scored pairs: its held-out split needs no scorer
    model.write_bytes(b"a model")
    scored = dict(config, clean_score_forward=str(model), clean_score_backward=str(model))
    assert store.eval_pairs(config, "test", scored) == carved


# ---------------------------------------------------------------------------- what a run trained on

def test_the_store_key_is_the_content_so_a_moved_corpus_finds_its_store(tmp_path: Path) -> None:
    first = text_store(config_for(write_parallel_files(tmp_path / "a" / "corpus", numbered_pairs(60)), tmp_path))
    moved = text_store(config_for(write_parallel_files(tmp_path / "b" / "corpus", numbered_pairs(60)), tmp_path))
    assert moved.folder == first.folder
    edited = text_store(config_for(write_parallel_files(tmp_path / "b" / "corpus", numbered_pairs(61)), tmp_path))
    assert edited.folder != first.folder


def test_a_split_trained_on_is_found_when_the_corpus_changed_after_training(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """evaluate.py's check, on the issue's case: the corpus grew after training, so its test split,
    carved anew, holds pairs the model trained on. Counted against the run's recorded stores; once
    those are gone, refused as not the split held out."""
    prefix = write_parallel_files(tmp_path / "corpus", numbered_pairs(400))
    config = config_for(prefix, tmp_path)
    record = store.data_record(config, store.text_stores(config), None)
    assert store.held_out_problem(store.eval_pairs(config, "test", config, record=record), "test", config, config,
                                  record) is None
    write_parallel_files(prefix, numbered_pairs(300, "x"), mode="a")
    recarved = text_store(config).pairs("test")
    trained = set(TextStore.open(Path(config["store_folder"]) / record["stores"][0]).pairs("train"))
    overlap = sum(pair in trained for pair in recarved)
    assert overlap > 0, "premise: the new carve takes pairs the first one trained on"
    assert store.held_out_problem(recarved, "test", config, config, record) == \
        f"{overlap} of the {len(recarved)} pairs of the test split have a source sentence the model trained on"
    assert store.eval_pairs(config, "test", config, record=record) != recarved  # the one held out, from its store
    shutil.rmtree(Path(config["store_folder"]) / record["stores"][0])
    assert "is not the one the model held out" in store.held_out_problem(recarved, "test", config, config, record)
    assert store.held_out_problem(recarved, "test", dict(config, test_data="news.tsv"), config, record) is None
    assert "data stores of the model's training pairs are gone" in capsys.readouterr().err


def test_a_bad_row_given_apart_is_named_by_its_split_and_a_held_out_training_corpus_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--valid_data's bad row was reported as `train: skipped`; --valid_data equal to the training
    corpus removed every training pair and ended in `no training pairs fit in --seq_len`."""
    prefix = write_parallel_files(tmp_path / "corpus", numbered_pairs(100))
    dev = write_parallel_files(tmp_path / "dev", numbered_pairs(10, "d") + [("Only English.", "")])
    text_store(config_for(prefix, tmp_path, valid_data=str(dev)))
    assert f"validation of {dev}: skipped 1 of 11 rows (1 empty side)" in capsys.readouterr().err
    with pytest.raises(sources.DataError, match=rf"^{prefix}: every one of its 95 training pairs has its source "
                                                rf"sentence in validation \({prefix}\): held-out pairs must not be"):
        text_store(config_for(prefix, tmp_path, valid_data=str(prefix)))


def test_an_unnamed_tsv_read_the_other_way_by_a_later_run_is_refused(tmp_path: Path) -> None:
    """Its name gives no languages, so each run reads its columns in the run's order: the first run's
    is remembered beside the stores, and a run in the other direction would swap them silently."""
    tsv = tmp_path / "corpus.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in numbered_pairs(50)), encoding="utf-8")
    text_store(config_for(tsv, tmp_path))
    with pytest.raises(sources.DataError, match="an earlier run read its columns as en, it; this one would read them "
                                                "as it, en"):
        text_store(config_for(tsv, tmp_path, lang_src="it", lang_tgt="en"))
    named = tsv.rename(tmp_path / "corpus.en-it.tsv")
    assert text_store(config_for(named, tmp_path, lang_src="it", lang_tgt="en")).pairs("train")[0][0].startswith("La")


def test_term_annotation_annotates_a_seeded_share_of_the_training_sources(tmp_path: Path) -> None:
    """With term_annotation 0.5 about half of the training sources carry a term inline (<term> ...
    <term_as> ... <term_end>), the held-out splits none; the store's key changes with the share and
    the seed, and one seed gives the same rows twice."""
    pairs = [(f"The {animal} number w{i} sleeps.", f"Il {name} numero w{i} dorme.")
             for i in range(300) for animal, name in [(("cat", "gatto"), ("dog", "cane"), ("bird", "uccello"))[i % 3]]]
    folder = write_hub_dataset(tmp_path / "data", {"train": pairs})
    config = config_for(folder, tmp_path, joint_vocab=True, term_annotation=0.5)
    text = text_store(config)
    tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, [text]))
    start, target, end = (tok_src.token_to_id(tag) for tag in ("<term>", "<term_as>", "<term_end>"))
    tokens = token_store(config, text, tok_src, tok_tgt)
    train_rows = tokens.dataset("train")
    annotated = [row for row in range(len(train_rows)) if start in train_rows[row][0].tolist()]
    assert 0.35 * len(train_rows) < len(annotated) < 0.65 * len(train_rows)
    assert tokens.meta["splits"]["train"]["annotated"] == len(annotated)
    for row in annotated[:20]:
        src = train_rows[row][0].tolist()
        assert src.count(start) == src.count(target) == src.count(end) >= 1
    for split in ("validation", "test"):
        rows = tokens.dataset(split)
        assert not any(start in rows[row][0].tolist() for row in range(len(rows)))
    plain = token_store({**config, "term_annotation": 0.0}, text, tok_src, tok_tgt)
    reseeded = token_store({**config, "seed": 7}, text, tok_src, tok_tgt)
    assert len({plain.folder, reseeded.folder, tokens.folder}) == 3
    assert not any(start in plain.dataset("train")[row][0].tolist() for row in range(len(train_rows)))
    shutil.rmtree(tokens.folder)
    again = token_store(config, text, tok_src, tok_tgt).dataset("train")
    assert all(again[row][0].tolist() == train_rows[row][0].tolist() for row in range(len(train_rows)))
