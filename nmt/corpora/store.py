"""The data store: each split's sentence pairs and token ids on disk, read by index without loading.

Two layers per corpus of `datasource` (config.corpora), each a folder under `store_folder` (default
`stores/`), built once and reused by every restart, resume and torchrun rank (rank 0 builds, the
others wait and map the same files):
1. The text store: the usable pairs of every split as UTF-8, in one streaming pass over the corpus
   (sources.py). The first corpus's (`text_store`) holds the held-out splits: validation and test
   given apart (`valid_data`, `test_data`: a folder's split, or a file pair's only split), else the
   corpus's own, else carved from its train split (capped); training pairs whose source sentence is
   in a carved split or one given apart are removed. Every other corpus's holds its train split
   without the pairs whose source sentence is in those held-out splits (`text_stores`).
   `filter_duplicates` drops repeated training pairs. Then the training pairs alone are cleaned
   (`_clean_train`, after carving, so the held-out splits are the same with cleaning on or off): by
   cleaning.py's rules (`clean`; the kept pairs NFC-normalised in a flat file of their own,
   clean-train), then by the scores of a model each way (`clean_score_*`: the scorer the program that
   builds the store hands it, nmt/inference/pair_scoring.py); the counts by reason and samples of
   the removed pairs go to cleaning.json in the store (`TextStore.cleaning`), logged in one line
   whenever the store is opened. Keyed by the corpus's fingerprint (its content,
   sources.Source.fingerprint), its language pair, the carving, filter, line-limit and cleaning
   settings (the scoring models by content), the fingerprints of the held-out sources given apart,
   and for the other corpora a digest of the held-out source sentences: adding a corpus reads only
   that corpus. Tokenizers train on a seeded sample of all the corpora's training pairs
   (`tokenizer_sample`). A run resumed on changed corpora with --data_changed keep_held_out takes
   the held-out splits of its earlier first text store (`KeptSplits`).
2. The token store: the token ids of the pairs that fit in `seq_len` (`filter_max_length_ratio`
   drops training pairs whose token lengths differ by more than that ratio); a tagged corpus's
   source rows start with its tag's id; with `term_annotation`, that share of the training sources,
   drawn with the run's seed, carries target terms inline (terms.py, from the corpus's word list).
   Keyed by the text store, both tokenizers' content hashes, seq_len, that ratio and the tag (and the
   annotation's share, seed and word list): with the tokenizers unchanged (a resume, --init_from),
   adding a corpus tokenizes only that corpus.
3. The word list (`term_store`): the renderings of the source words of some text stores' training
   pairs (terms.py), keyed by those stores and the sample it counts.
Another corpus, pair, setting or tokenizer gives another key, so a stale store is never read.

What a run trained on (`data_record`, in every checkpoint and in weights/<experiment>/data.json):
`data_identity` (each corpus's content and the held-out files'), the digests of its validation and
test pairs and the names of its text stores. train.py compares it on resume (`data_changes`);
evaluate.py reads the model's own split from those stores (`eval_pairs`) and refuses one that
shares source sentences with their training pairs (`held_out_problem`).

Format, as in fairseq's indexed datasets: per split, all source sequences end to end in one flat
file, all target sequences in another, and an offsets array (2, rows + 1): token rows are read
through np.memmap, text rows with file reads (`read_texts`), and nothing is loaded whole. Token
ids use the smallest unsigned type that holds the vocabulary (uint16 up to 65,536 entries).
Chosen over Arrow through `datasets` because it needs nothing beside NumPy, its ids are 2 bytes instead of Arrow's 8-byte
int64 lists, and it is built atomically in a few lines: everything is written into a temporary
folder `.NAME.tmp<pid>` with a `meta.json` recording each file's size and sha256, which is renamed
into place last.

Only the builder deletes. `Store.open_or_build` (rank 0, through `text_store` and `token_store`) is
the one path that builds, and it builds under a lock per store (`.NAME.lock`, atomic_files.lock_file:
flock, dropped by the kernel when its owner dies): a second process building the same store waits,
then opens the first one's result. Holding that lock proves that no live process is building the
store, so the builder then removes the `.NAME.tmp*` leftovers of a build that died, and replaces a
damaged folder (one-line message): one with a file missing, a size or sha256 that differs from
meta.json, or a meta.json that is not a store's. Any other error while reading a store (EIO,
EACCES, ...) is not damage: a one-line DataError, and nothing is deleted. The builder never touches
another store's files. `Store.open`, for the ranks that only read, never deletes: a missing or
damaged store is a DataError there. Any OSError of a build (creating store_folder or the lock file
included) is a one-line DataError naming the store; its temporary folder is removed and the stores
already built are left as they are, which a full disk's message (ENOSPC, EFBIG, EDQUOT) says.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer

from nmt.atomic_files import atomic_write_bytes, lock_file, sha256_of
from nmt.corpora.cleaning import (Cleaner, PairScorer, cleaning_description, report_line, scoring_summary,
                                  settings_from_config)
from config import TERM_TAGS, Corpus, corpora, corpus_entries, corpus_name, target_tag
from dataset import BilingualDataset, fits
from nmt.diagnostics import log
from nmt.corpora.file_digests import FileDigests
from nmt.corpora.sources import SPLITS, DataError, Pair, Source, carve, open_source, read_all_pairs, read_pairs, text_hash
from nmt.corpora.terms import DICE, MIN_PAIRS, RENDERINGS, WordList, annotated_ids, dice_table, renderings
from nmt.corpora.tokenizer import encode_texts, tag_id, tokenizer_hash

STORE_FORMAT = 1
CLEANING_FILE = "cleaning.json"  # in a text store: what cleaning removed from its training pairs
ENCODE_BATCH = 20_000  # pairs tokenized per call: bounds memory, keeps the tokenizer's threads busy
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # errors that mean "no room to write"
TERMS_FILE = "renderings.json"  # in a word-list store
TERM_SAMPLE = 200_000  # training pairs a word list counts, at most: enough for a word's usual renderings


def smallest_id_type(vocab_size: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise DataError(f"a vocabulary of {vocab_size} entries does not fit 32-bit ids")


class PairWriter:
    """Appends pairs of sequences (bytes, or arrays of ids) to the flat files of one split."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.files = [open(folder / f"{name}.{side}.bin", "wb") for side in ("src", "tgt")]
        self.offsets_path = folder / f"{name}.offsets.npy"
        self.lengths: list[np.ndarray] = []

    def add(self, sources: Sequence[Any], targets: Sequence[Any]) -> None:
        """Append rows: UTF-8 bytes (a text store) or lists of token ids (a token store)."""
        self.lengths.append(np.array([[len(s) for s in sources], [len(t) for t in targets]],
                                     dtype=np.int64).reshape(2, -1))
        for handle, sequences in zip(self.files, (sources, targets)):
            if sequences and isinstance(sequences[0], bytes):
                handle.write(b"".join(sequences))
            else:
                handle.write(np.fromiter(chain.from_iterable(sequences), dtype=self.dtype).tobytes())

    def close(self) -> int:
        for handle in self.files:
            handle.close()
        lengths = np.concatenate(self.lengths, axis=1) if self.lengths else np.zeros((2, 0), dtype=np.int64)
        offsets = np.zeros((2, lengths.shape[1] + 1), dtype=np.int64)
        np.cumsum(lengths, axis=1, out=offsets[:, 1:])
        np.save(self.offsets_path, offsets)
        return lengths.shape[1]


@dataclass
class PairArrays:
    """One split's flat files, memory-mapped."""

    src: np.ndarray
    tgt: np.ndarray
    offsets: np.ndarray

    @classmethod
    def open(cls, folder: Path, name: str, dtype: np.dtype) -> "PairArrays":
        def mapped(path: Path) -> np.ndarray:  # np.memmap refuses empty files
            return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype=dtype)
        return cls(mapped(folder / f"{name}.src.bin"), mapped(folder / f"{name}.tgt.bin"),
                   np.load(folder / f"{name}.offsets.npy", mmap_mode="r"))

    def __len__(self) -> int:
        return self.offsets.shape[1] - 1


def read_texts(folder: Path, name: str, rows: np.ndarray) -> list[Pair]:
    """The text pairs at `rows` of the flat files `name`, read with plain file reads. Not through a
    memory map: there, the kernel maps 64 KB around each row touched (fault-around), and the 3,000
    scattered validation rows of a 4M-pair store put 0.5 GB of the file into the process's RSS."""
    offsets = np.load(folder / f"{name}.offsets.npy", mmap_mode="r")
    starts, ends = offsets[:, rows].tolist(), offsets[:, rows + 1].tolist()
    return list(zip(*(_read_side(folder / f"{name}.{side}.bin", starts[i], ends[i])
                      for i, side in enumerate(("src", "tgt")))))


def _read_side(path: Path, starts: list[int], ends: list[int]) -> list[str]:
    """The byte ranges [start, end) of `path`, decoded: one read for a run of ranges close together
    (a chunk of train), one per range otherwise."""
    needed = sum(end - start for start, end in zip(starts, ends))
    in_order = all(a <= b for a, b in zip(starts, starts[1:]))
    with open(path, "rb", buffering=0) as handle:
        if starts and in_order and ends[-1] - starts[0] <= 2 * needed + (1 << 20):
            handle.seek(starts[0])
            block, base = handle.read(ends[-1] - starts[0]), starts[0]
            return [block[start - base:end - base].decode("utf-8") for start, end in zip(starts, ends)]
        texts = []
        for start, end in zip(starts, ends):
            handle.seek(start)
            texts.append(handle.read(end - start).decode("utf-8"))
        return texts


class StoreDamage(ValueError):
    """A store folder whose meta.json or files do not match; the message says which."""


def checked_meta(folder: Path, verify: bool) -> dict[str, Any]:
    """The meta.json of the store at `folder`, every file's size checked against it, and its sha256
    too when `verify`. Raises StoreDamage for what shows the store damaged: a missing file, a
    meta.json that is not a store's, a size or sha256 that differs. Any other OSError (EIO, EACCES,
    EMFILE, ...) says nothing about the store, which must then be left as it is: a DataError."""
    try:
        try:
            meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            recorded = {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in meta["files"].items()}
        except KeyError as error:
            raise StoreDamage(f"meta.json lacks {error}") from None
        except (ValueError, TypeError, AttributeError) as error:  # not JSON, or not a store's
            raise StoreDamage(f"meta.json is not a data store's: {str(error).splitlines()[0]}") from None
        for name, (size, digest) in recorded.items():
            actual = (folder / name).stat().st_size
            if actual != size:
                raise StoreDamage(f"{name} has {actual} bytes, not {size}")
            if verify and sha256_of(folder / name) != digest:
                raise StoreDamage(f"{name} does not match its sha256")
    except FileNotFoundError as error:
        raise StoreDamage(f"{Path(error.filename).name} is missing") from None
    except OSError as error:
        raise DataError(f"cannot read the data store {folder}: {os_reason(error)}") from None
    return meta


def os_reason(error: OSError) -> str:
    """An OSError in words, with the path it names: "Not a directory: /data/file/stores"."""
    reason = error.strerror or str(error)
    return f"{reason}: {error.filename}" if error.filename else reason


@contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold the build lock of the store at `folder` (`.NAME.lock` beside it), waiting for a process
    that holds it, with one line saying so."""
    def wait(owner: str) -> None:
        log(f"waiting for process {owner}, which is building the data store {folder}")

    with lock_file(folder.with_name(f".{folder.name}.lock"), wait):
        yield  # closing the file releases the lock


@contextmanager
def write_errors_as_data_error(folder: Path) -> Iterator[None]:
    """A write refused while building the store at `folder` (a full disk, a read-only folder, a
    store_folder under a plain file, ...) becomes one line naming the store."""
    try:
        yield
    except OSError as error:
        message = f"cannot write the data store {folder}: {os_reason(error)}"
        if error.errno in DISK_FULL:
            message += f"; nothing of it was kept, and the stores already in {folder.parent} are intact"
        raise DataError(message) from None


class Store:
    """A built store folder and its meta.json."""

    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        self.folder, self.meta = Path(folder), meta

    @classmethod
    def open(cls, folder: Path, verify: bool = True) -> "Store":
        """The store at `folder`, for a process that only reads it (the ranks that wait for rank 0).
        A missing or damaged store is a DataError and is left as it is: only its builder replaces it.
        `verify` checks every file's sha256 besides its size."""
        folder = Path(folder)
        if not folder.is_dir():
            raise DataError(f"data store {folder} does not exist")
        try:
            return cls(folder, checked_meta(folder, verify))
        except StoreDamage as damage:
            raise DataError(f"data store {folder} is damaged ({damage}); the next run that builds it (rank 0) "
                            f"replaces it") from None

    @classmethod
    def open_or_build(cls, folder: Path, key: dict[str, Any], fill: Callable[[Path], dict[str, Any]],
                      building: str) -> "Store":
        """The store at `folder`, verified; built with `fill(temporary_folder) -> meta` (after logging
        `building`) when there is none or it is damaged. The only path that deletes anything."""
        folder = Path(folder)
        if folder.is_dir():
            try:
                return cls(folder, checked_meta(folder, verify=True))
            except StoreDamage:
                pass  # checked again under the lock: another process may be replacing it
        with write_errors_as_data_error(folder):
            folder.parent.mkdir(parents=True, exist_ok=True)
            with build_lock(folder):
                if folder.is_dir():  # built by the process this one waited for, or damaged
                    try:
                        return cls(folder, checked_meta(folder, verify=True))
                    except StoreDamage as damage:
                        cls._remove_damaged(folder, damage)
                log(building)
                return cls(folder, cls._build(folder, key, fill))

    @staticmethod
    def _remove_damaged(folder: Path, damage: StoreDamage) -> None:
        """Under the build lock: remove the damaged store at `folder`, saying why, before rebuilding it."""
        try:
            shutil.rmtree(folder)
        except OSError as error:
            raise DataError(f"data store {folder} is damaged ({damage}) and cannot be removed: "
                            f"{os_reason(error)}") from None
        log(f"data store {folder} is damaged ({damage}); rebuilding it")

    @staticmethod
    def _build(folder: Path, key: dict[str, Any], fill: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """Under the build lock: fill a temporary folder and rename it into place whole; its meta."""
        leftover = re.compile(rf"\.{re.escape(folder.name)}\.tmp\d+")
        for stale in folder.parent.iterdir():
            if leftover.fullmatch(stale.name):
                shutil.rmtree(stale, ignore_errors=True)  # a build that died halfway: the lock says none runs
        temporary = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
        temporary.mkdir()
        try:
            meta = {"format": STORE_FORMAT, "key": key, **fill(temporary)}
            meta["files"] = {path.name: {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
                             for path in sorted(temporary.iterdir())}
            atomic_write_bytes(temporary / "meta.json", json.dumps(meta, indent=1).encode("utf-8"))
            temporary.rename(folder)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        return meta


def _store_folder(config: dict[str, Any], corpus: Corpus, kind: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:16]
    return Path(config["store_folder"]) / f"{corpus_name(corpus.source)}_{config['lang_src']}-{corpus.lang_tgt}_" \
                                          f"{kind}_{digest}"


def _pair(config: dict[str, Any], corpus: Corpus) -> str:
    return f"{config['lang_src']}-{corpus.lang_tgt}"


def open_data(config: dict[str, Any], datasource: str, lang_tgt: str) -> Source:
    """`datasource` opened in the pair lang_src-`lang_tgt`, with the config's line limit, its files'
    digests remembered beside the stores (file_digests.py)."""
    return open_source(datasource, config["lang_src"], lang_tgt, config["max_line_bytes"],
                       FileDigests(config["store_folder"]))


# ---------------------------------------------------------------------------- the text store

class TextStore(Store):
    """The usable sentence pairs of each split (after carving and filters)."""

    def splits(self) -> list[str]:
        return [name for name in SPLITS if name in self.meta["splits"]]

    def size(self, split: str) -> int:
        return self.meta["splits"][split]["pairs"] if split in self.meta["splits"] else 0

    def pairs(self, split: str, rows: Sequence[int] | None = None) -> list[Pair]:
        """The pairs of `split` (or those at `rows` of it): for held-out splits and samples."""
        if split not in self.meta["splits"]:
            return []
        index = np.load(self.folder / f"{split}.rows.npy", mmap_mode="r")
        chosen = index if rows is None else index[np.asarray(rows, dtype=np.int64)]
        return read_texts(self.folder, self.meta["splits"][split]["raw"], np.asarray(chosen, dtype=np.int64))

    def iter_pairs(self, split: str, chunk: int = ENCODE_BATCH) -> Iterator[list[Pair]]:
        for start in range(0, self.size(split), chunk):
            yield self.pairs(split, range(start, min(start + chunk, self.size(split))))

    def cleaning(self) -> dict[str, Any] | None:
        """What cleaning removed from the training pairs (`_clean_train`'s report), None when the
        store was built without cleaning."""
        path = self.folder / CLEANING_FILE
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def held_out_hashes(self) -> np.ndarray:
        """The sorted hashes of the source sentences of the validation and test splits."""
        return np.unique(np.fromiter((text_hash(source) for split in ("validation", "test")
                                      for source, _ in self.pairs(split)), dtype=np.uint64))


def tokenizer_sample(config: dict[str, Any], stores: Sequence[TextStore]) -> Iterator[Pair]:
    """A seeded sample of at most `tokenizer_max_sentences` of all the corpora's training pairs, in
    corpus order: what the tokenizers are trained on (all of them below the cap)."""
    return train_sample(config, stores, config["tokenizer_max_sentences"])


def train_sample(config: dict[str, Any], stores: Sequence[TextStore], cap: int) -> Iterator[Pair]:
    """A sample of at most `cap` of all the corpora's training pairs, drawn with the run's seed, in
    corpus order (all of them below the cap)."""
    sizes = [store.size("train") for store in stores]
    starts = np.cumsum([0, *sizes])
    n = int(starts[-1])
    rows = np.arange(n) if n <= cap else np.sort(np.random.default_rng(config["seed"]).choice(n, cap, False))
    for store, start, end in zip(stores, starts, starts[1:]):
        mine = rows[(rows >= start) & (rows < end)] - start
        for first in range(0, len(mine), ENCODE_BATCH):
            yield from store.pairs("train", mine[first:first + ENCODE_BATCH])


def _given_apart(config: dict[str, Any], corpus: Corpus) -> dict[str, tuple[Source, str]]:
    """The held-out splits named by `valid_data` / `test_data`, each with the source and split to read:
    a folder's validation (test) split, or the one split of a file pair or TSV file."""
    given = {}
    for name, option in (("validation", "valid_data"), ("test", "test_data")):
        if config[option]:
            source = open_data(config, config[option], corpus.lang_tgt)
            split = name if name in source.splits else "train" if source.splits == ["train"] else None
            if split is None:
                raise DataError(f"--{option} {config[option]!r} has no {name} split (found: "
                                f"{', '.join(source.splits)})")
            given[name] = (source, split)
    return given


def _open_corpus(config: dict[str, Any], corpus: Corpus) -> Source:
    source = open_data(config, corpus.source, corpus.lang_tgt)
    if "train" not in source.splits:
        raise DataError(f"{corpus.source!r} has no train split (found: {', '.join(source.splits)})")
    return source


@dataclass
class KeptSplits(Source):
    """The held-out splits of an earlier text store, read as a source: what a run resumed on changed
    corpora with --data_changed keep_held_out validates and tests on, whatever the corpus holds now."""

    store: TextStore | None = None

    @property
    def fingerprint(self) -> str:  # type: ignore[override]
        return f"kept from {self.store.folder.name}"

    def rows(self, split: str) -> Iterator[list[dict]]:
        for pairs in self.store.iter_pairs(split):
            yield [{"translation": {self.languages[0]: s, self.languages[1]: t}} for s, t in pairs]


def _kept_splits(config: dict[str, Any], corpus: Corpus, name: str) -> dict[str, tuple[Source, str]]:
    """The validation and test splits of the text store `name`, which a run keeps (`KeptSplits`)."""
    folder = Path(config["store_folder"]) / name
    try:
        store = TextStore.open(folder)
    except DataError as error:
        raise DataError(f"this run keeps the held-out splits of {folder} (--data_changed keep_held_out), but {error}: "
                        f"start a new run (--experiment_name)") from None
    source = KeptSplits(str(folder), (config["lang_src"], corpus.lang_tgt), store.splits(), store=store)
    return {split: (source, split) for split in ("validation", "test") if split in store.splits()}


def text_store(config: dict[str, Any], held_out_from: str | None = None,
               scorer: PairScorer | None = None) -> TextStore:
    """The text store of the first corpus, which holds the held-out splits: each of validation and
    test given apart (`valid_data`, `test_data`), else the corpus's own, else carved from its train
    split; or, for a run that goes on on changed corpora, those of its earlier text store named
    `held_out_from`. Its training pairs whose source sentence is in a carved split or one given
    apart are removed. Opened, or built from the corpus (its training pairs scored by `scorer` with
    clean_score_forward: nmt.inference.pair_scoring.pair_scorer, which only a build calls)."""
    corpus = corpora(config)[0]
    source = _open_corpus(config, corpus)
    given = _kept_splits(config, corpus, held_out_from) if held_out_from else _given_apart(config, corpus)
    reads = {name: (source, name) for name in SPLITS if name in source.splits and name not in given} | given
    missing = [name for name in ("validation", "test") if name not in reads]
    # Carving settings matter only to a source that is carved.
    carving = {k: config[k] for k in ("seed", "val_fraction", "test_fraction", "val_max_pairs", "test_max_pairs")} \
        if missing else {}
    apart = {f"{name}_given": held.fingerprint for name, (held, _) in given.items()}
    return _text_store(config, corpus, source, {**carving, **apart}, reads=reads, missing=missing, apart=list(given),
                       scorer=scorer)


def _own_split(config: dict[str, Any], split: str, model_config: dict[str, Any]) -> bool:
    """Whether `split` is read from the model's own first corpus: not given apart, of its datasource."""
    option = {"validation": "valid_data", "test": "test_data"}.get(split)
    return config["datasource"] == model_config["datasource"] and not (option and config[option])


def _recorded_store(config: dict[str, Any], record: dict[str, Any] | None, index: int) -> TextStore | None:
    """The text store a run recorded (`data_record`'s `stores`, number `index`), opened without hashing
    its files; None when it is gone."""
    folder = Path(config["store_folder"]) / record["stores"][index] if record else None
    return TextStore.open(folder, verify=False) if folder is not None and folder.is_dir() else None


def eval_pairs(config: dict[str, Any], split: str, model_config: dict[str, Any], lang_tgt: str = "",
               record: dict[str, Any] | None = None) -> list[Pair]:
    """The pairs of `split` to score a model on, from its source language into `lang_tgt` (one of its
    target languages; "": its only one). `valid_data` / `test_data` name them apart; else, of the
    model's own corpus, the split as its training held it out, from the text store its `record`
    (`data_record`) names, while there is one; else a split the corpus has is read as it is, and a
    validation or test split it lacks is the one its training held out (`text_store` with the model's
    settings, so carved with its seed, and without its scoring: no model is loaded). The corpus is
    the first of `datasource`, or in a model of several target languages the one tagged for
    `lang_tgt`."""
    lang_src, lang_tgt = model_config["lang_src"], lang_tgt or model_config["lang_tgt"]
    entries = corpus_entries(config["datasource"])
    first = next((entry for entry in entries if entry[2] == target_tag(lang_tgt)), entries[0])
    corpus = Corpus(first[0], 1.0, "", lang_tgt)
    held = _recorded_store(config, record, 0) if first is entries[0] and split in ("validation", "test") and \
        _own_split(config, split, model_config) else None
    if held is not None:
        log(f"the {split} split as the model's training held it out, from the data store {held.folder}")
        return held.pairs(split)
    given = _given_apart(dict(config, lang_src=lang_src), corpus)
    if split in given:
        source, read = given[split]
        where = f"--{dict(validation='valid_data', test='test_data')[split]} {source.datasource!r}"
    else:
        source, read = open_data(dict(config, lang_src=lang_src), corpus.source, corpus.lang_tgt), split
        where = f"{corpus.source!r}"
    if read in source.splits and (read != "train" or split in given):
        pairs = read_all_pairs(source, read, lang_src, lang_tgt)
    elif split in SPLITS and "train" in source.splits:
        if first is not entries[0]:
            raise DataError(f"{corpus.source!r} has no {split} split, and training held out only its first corpus's "
                            f"({entries[0][0]!r}): name the pairs with --{'test' if split == 'test' else 'valid'}_data")
        # Held-out splits are carved before cleaning, so the same without scoring.
        training = {**model_config, "datasource": config["datasource"], "store_folder": config["store_folder"],
                    "clean_score_forward": "", "clean_score_backward": ""}
        pairs = text_store(training).pairs(split)
    else:
        raise DataError(f"{where} has no {split!r} split (found: {', '.join(source.splits)})")
    if not pairs:
        raise DataError(f"the {split!r} split of {where} has no usable {lang_src}-{lang_tgt} pairs")
    return pairs


def text_stores(config: dict[str, Any], held_out_from: str | None = None,
                scorer: PairScorer | None = None) -> list[TextStore]:
    """The text store of every corpus, in `datasource` order: the first is `text_store`'s (with the
    held-out splits of `held_out_from`, when given), and each other holds its corpus's train split
    without the pairs whose source sentence is in the first's held-out splits (keyed by a digest of
    those sentences, so that adding a corpus reads only it). A store built with clean_score_forward
    scores its training pairs with `scorer` (`text_store`)."""
    first = text_store(config, held_out_from, scorer)
    held_out = first.held_out_hashes()
    stores = [first]
    for corpus in corpora(config)[1:]:
        source = _open_corpus(config, corpus)
        stores.append(_text_store(config, corpus, source, {"held_out": hashlib.sha256(held_out.tobytes()).hexdigest()},
                                  reads={"train": (source, "train")}, missing=[], apart=[], held_out=held_out,
                                  scorer=scorer))
    return stores


def held_out_problem(pairs: Sequence[Pair], split: str, config: dict[str, Any], model_config: dict[str, Any],
                     record: dict[str, Any] | None) -> str | None:
    """Why scoring the model on `pairs` (its `split` by `config`) would score it on what it trained
    on, in words; None when it would not, or cannot be told (no `record`: a model from before them).
    One of the validation and test splits it held out is fine by its digest; any other is checked
    against the training pairs of the text stores the record names, and when they are gone, a split
    of its own corpus that is no longer the one held out is a problem."""
    if record is None or split_digest(pairs) in record["held_out"].values():
        return None
    stores = [_recorded_store(config, record, index) for index in range(len(record["stores"]))]
    if None in stores:
        if not _own_split(config, split, model_config):
            log(f"the data stores of the model's training pairs are gone: not checked whether {split} holds any")
            return None
        return (f"the {split} split of {config['datasource']} is not the one the model held out (its corpus changed "
                f"since?), and the data stores that would tell how much of it the model trained on are gone")
    wanted = np.unique(np.fromiter((text_hash(source) for source, _ in pairs), np.uint64, len(pairs)))
    trained = np.zeros(len(wanted), dtype=bool)
    for store in stores:
        for chunk in store.iter_pairs("train"):
            trained |= np.isin(wanted, np.fromiter((text_hash(source) for source, _ in chunk), np.uint64, len(chunk)))
    hashes = np.fromiter((text_hash(source) for source, _ in pairs), np.uint64, len(pairs))
    if overlap := int(np.isin(hashes, wanted[trained]).sum()):
        return f"{overlap} of the {len(pairs)} pairs of the {split} split have a source sentence the model trained on"
    return None


# ---------------------------------------------------------------------------- what a run trained on

def data_identity(config: dict[str, Any], fingerprints: Sequence[str] | None = None) -> dict[str, Any]:
    """What a run's data is, by content: each corpus's source, weight, tag and fingerprint
    (sources.Source.fingerprint; `fingerprints` when known, in corpus order), and the fingerprints of
    the held-out files given apart. Reads a file only when file_digests.py does not know its content."""
    first = corpora(config)[0]
    if fingerprints is None:
        fingerprints = [_open_corpus(config, corpus).fingerprint for corpus in corpora(config)]
    identity: dict[str, Any] = {"corpora": [{"source": corpus.source, "weight": corpus.weight, "tag": corpus.tag,
                                             "fingerprint": fingerprint}
                                            for corpus, fingerprint in zip(corpora(config), fingerprints)]}
    for option in ("valid_data", "test_data"):
        identity[option] = open_data(config, config[option], first.lang_tgt).fingerprint if config[option] else ""
    return identity


def split_digest(pairs: Sequence[Pair]) -> str:
    """The identity of a split's pairs: the sha256 of them, in order."""
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(f"{source}\t{target}\n".encode("utf-8"))
    return digest.hexdigest()


def data_record(config: dict[str, Any], texts: Sequence[TextStore], held_out_from: str | None) -> dict[str, Any]:
    """What a run's checkpoints (and the data.json beside them) record of its data: `data_identity`,
    the identity of its validation and test splits, the names of its text stores (whose train splits
    are what it trained on) and the store whose held-out splits it keeps, if any."""
    identity = data_identity(config, [text.meta["key"]["datasource"] for text in texts])
    return {**identity, "held_out": {split: split_digest(texts[0].pairs(split))
                                                  for split in ("validation", "test")},
            "stores": [text.folder.name for text in texts], "held_out_from": held_out_from}


DATA_RECORD = "data.json"  # beside a run's checkpoints, its `data_record`, for evaluate.py


def read_data_record(folder: Path) -> dict[str, Any] | None:
    """The `data_record` a run wrote into its folder; None when there is none (a run from before it
    existed) or it cannot be read."""
    try:
        record = json.loads((Path(folder) / DATA_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("held_out"), dict) else None


def data_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How the data of `current` (`data_identity`) differs in content from the `saved` record, one
    phrase per corpus or file that changed; [] when it is the same data, wherever it lies now."""
    changes = [f"corpus {now['source']} holds other data than it did"
               for was, now in zip(saved["corpora"], current["corpora"]) if was["fingerprint"] != now["fingerprint"]]
    return changes + [f"--{option} holds other data than it did" for option in ("valid_data", "test_data")
                      if saved.get(option, "") != current[option]]


def _text_store(config: dict[str, Any], corpus: Corpus, source: Source, held: dict[str, Any],
                **fill: Any) -> TextStore:
    """The text store of `corpus`, read from `source`: opened, or built by `_fill_text_store` with the
    arguments `fill`. Keyed by the corpus's fingerprint and pair, `filter_duplicates`, the cleaning
    (cleaning.cleaning_description) and `held`: what decides its held-out splits (carving settings,
    held-out sources, hashes). The fingerprint is the corpus's content (sources.Source.fingerprint),
    so the same bytes under another path find the same key, and other bytes under the same path
    another."""
    key = {"format": STORE_FORMAT, "datasource": source.fingerprint, "pair": list(source.languages),
           "filter_duplicates": config["filter_duplicates"], "max_line_bytes": config["max_line_bytes"],
           "cleaning": cleaning_description(config), **held}
    folder = _store_folder(config, corpus, "text", key)
    store = TextStore.open_or_build(folder, key, partial(_fill_text_store, config=config, corpus=corpus, **fill),
                                    f"building the data store {folder} from {corpus.source}")
    log(f"data store {store.folder}: " + ", ".join(f"{name} {store.size(name)}" for name in store.splits())
        + " pairs")
    if (report := store.cleaning()) is not None:
        log(report_line(report))
    return store


def _fill_text_store(folder: Path, config: dict[str, Any], corpus: Corpus, reads: dict[str, tuple[Source, str]],
                     missing: list[str], apart: list[str], held_out: np.ndarray | None = None,
                     scorer: PairScorer | None = None) -> dict[str, Any]:
    """Read each split of `reads` (name -> the source and split to read) into the store, carve the
    `missing` held-out splits from train, then drop the training pairs whose source sentence is in a
    held-out split from elsewhere (the splits named in `apart`, and `held_out`'s hashes), repeated
    pairs with `filter_duplicates`, and clean what is left (`_clean_train`): after carving, so that
    the held-out splits are neither cleaned nor carved otherwise with cleaning on or off (`scorer`:
    scoring's, with clean_score_forward)."""
    counts: dict[str, int] = {}
    hashes: dict[str, np.ndarray] = {}
    pair_hashes: list[np.ndarray] = []
    for name, (source, split) in reads.items():
        writer = PairWriter(folder, f"raw-{name}", np.dtype(np.uint8))
        source_hashes = [np.zeros(0, dtype=np.uint64)]
        # Said by its split: a bad row of --valid_data is validation's, not the file's only split's (train).
        label = name if source.datasource == corpus.source else f"{name} of {source.datasource}"
        for pairs in read_pairs(source, split, config["lang_src"], corpus.lang_tgt, label):
            writer.add([s.encode("utf-8") for s, _ in pairs], [t.encode("utf-8") for _, t in pairs])
            source_hashes.append(np.fromiter((text_hash(s) for s, _ in pairs), np.uint64, len(pairs)))
            if name == "train" and config["filter_duplicates"]:
                pair_hashes.append(np.fromiter((text_hash(s + "\t" + t) for s, t in pairs), np.uint64, len(pairs)))
        counts[name] = writer.close()
        hashes[name] = np.concatenate(source_hashes)
    if not counts["train"]:
        raise DataError(f"{corpus.source!r} has no usable {_pair(config, corpus)} training pairs")
    rows = {name: np.arange(counts[name]) for name in counts}
    if missing:
        rows.update(carve(hashes["train"], config, missing))
        log(f"split the train split with seed {config['seed']} into "
            + ", ".join(f"{name} {len(rows[name])}" for name in ["train"] + missing))
    if apart or held_out is not None:
        elsewhere = np.concatenate([np.zeros(0, dtype=np.uint64) if held_out is None else held_out,
                                    *(hashes[name] for name in apart)])
        overlap = np.isin(hashes["train"][rows["train"]], elsewhere)
        log(f"{corpus_name(corpus.source)}: removed {int(overlap.sum())} of {len(overlap)} training pairs whose "
            f"source sentence is in a held-out split")
        if len(overlap) and overlap.all():
            where = " and ".join(f"{name} ({reads[name][0].datasource})" for name in apart) or \
                "the first corpus's held-out splits"
            raise DataError(f"{corpus.source}: every one of its {len(overlap)} training pairs has its source sentence "
                            f"in {where}: held-out pairs must not be the training corpus; hold out other pairs")
        rows["train"] = rows["train"][~overlap]
    if config["filter_duplicates"]:
        train_hashes = np.concatenate(pair_hashes)[rows["train"]]
        _, first = np.unique(train_hashes, return_index=True)
        log(f"filter_duplicates: dropped {len(rows['train']) - len(first)} of {len(rows['train'])} training pairs "
            f"that repeat an earlier pair")
        rows["train"] = rows["train"][np.sort(first)]
    train_raw = "raw-train"
    if config["clean"] or config["clean_score_forward"]:
        train_raw, rows["train"] = _clean_train(folder, config, corpus, rows["train"], scorer)
    splits = {}
    for name, index in rows.items():
        np.save(folder / f"{name}.rows.npy", index.astype(np.int64))
        raw = train_raw if name == "train" else "raw-train" if name in missing else f"raw-{name}"
        splits[name] = {"raw": raw, "pairs": len(index)}
    return {"splits": splits}


def _clean_train(folder: Path, config: dict[str, Any], corpus: Corpus, rows: np.ndarray,
                 scorer: PairScorer | None) -> tuple[str, np.ndarray]:
    """The training pairs at `rows` of raw-train, cleaned: by the rules (`clean`; the pairs they keep,
    NFC-normalised, written to clean-train), then scored by `scorer` (`clean_score_*`; the best share
    kept). Returns the flat files the train split reads and its rows there. What was removed, by
    reason with samples, goes to CLEANING_FILE (a sample's row: the pair's place among the corpus's
    usable training pairs, from 0)."""
    report: dict[str, Any] = {"corpus": corpus.source, "rules": None, "scoring": None}
    asked = len(rows)
    raw, numbers = "raw-train", rows  # numbers: the raw-train row of each row of `rows`
    if config["clean"]:
        numbers, report["rules"] = _apply_rules(folder, config, corpus, rows)
        raw, rows = "clean-train", np.arange(len(numbers))
    if config["clean_score_forward"]:
        kept, report["scoring"] = _apply_scoring(folder, config, corpus, raw, rows, numbers, scorer)
        rows = rows[kept]
    if len(rows) == 0 < asked:
        raise DataError(f"cleaning removed every training pair of {corpus.source!r} ({report_line(report)}): "
                        f"loosen the clean_* settings, or --clean false")
    atomic_write_bytes(folder / CLEANING_FILE, json.dumps(report, ensure_ascii=False, indent=1).encode("utf-8"))
    return raw, rows


def _apply_rules(folder: Path, config: dict[str, Any], corpus: Corpus,
                 rows: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Ask the rules (cleaning.Cleaner) about each pair at `rows` of raw-train, and write those they
    keep to clean-train, NFC-normalised. Returns the raw-train row of each kept pair, and the report
    (its samples' rows numbered as raw-train's)."""
    cleaner = Cleaner(settings_from_config(config), config["lang_src"], corpus.lang_tgt, config["clean_samples"],
                      config["seed"])
    writer = PairWriter(folder, "clean-train", np.dtype(np.uint8))
    kept_rows = [np.zeros(0, dtype=np.int64)]
    for start in range(0, len(rows), ENCODE_BATCH):
        chunk = rows[start:start + ENCODE_BATCH]
        pairs, kept = cleaner.mark(read_texts(folder, "raw-train", chunk))
        kept_pairs = [pair for pair, keep in zip(pairs, kept) if keep]
        writer.add([s.encode("utf-8") for s, _ in kept_pairs], [t.encode("utf-8") for _, t in kept_pairs])
        kept_rows.append(chunk[kept])
    writer.close()
    report = cleaner.report.as_dict()
    for samples in report["samples"].values():
        for sample in samples:
            sample["row"] = int(rows[sample["row"]])  # the cleaner counts the pairs it was asked about
    return np.concatenate(kept_rows), report


def _apply_scoring(folder: Path, config: dict[str, Any], corpus: Corpus, raw: str, rows: np.ndarray,
                   numbers: np.ndarray, scorer: PairScorer | None) -> tuple[np.ndarray, dict[str, Any]]:
    """Score the pairs at `rows` of the flat files `raw` with `scorer` (the clean_score_* models'
    dual conditional cross-entropy), in chunks. Returns the positions in `rows` of the best
    clean_score_keep share, in order, and the report: how many were scored and kept, the highest
    score kept, and the worst pairs (their rows: `numbers`')."""
    if scorer is None:
        raise DataError(f"--clean_score_forward asks to score the training pairs of {corpus.source!r}, but the "
                        f"program building its data store gave it no scorer (nmt.inference.pair_scoring.pair_scorer)")
    scores = [np.zeros(0)]
    try:
        for start in range(0, len(rows), ENCODE_BATCH):
            scores.append(scorer(read_texts(folder, raw, rows[start:start + ENCODE_BATCH]), config["lang_src"],
                                 corpus.lang_tgt))
    except ValueError as error:  # a model of another pair
        raise DataError(f"cannot score {corpus.source!r} with --clean_score_forward and --clean_score_backward: "
                        f"{error}") from None
    scored = np.concatenate(scores)
    best, summary, worst = scoring_summary(scored, config["clean_score_keep"], config["clean_samples"])
    summary["worst"] = [{"row": int(numbers[i]), "source": source, "target": target, "score": float(scored[i])}
                        for i, (source, target) in zip(worst, read_texts(folder, raw, rows[worst]))]
    return best, summary


# ---------------------------------------------------------------------------- the word list

class TermStore(Store):
    """The word list of some corpora's training pairs (terms.py): what term_annotation annotates,
    and the renderings a run stores with its model."""

    def word_list(self) -> WordList:
        return WordList(json.loads((self.folder / TERMS_FILE).read_text(encoding="utf-8")))


def term_store(config: dict[str, Any], texts: Sequence[TextStore]) -> TermStore:
    """The word list of the training pairs of `texts` (at most TERM_SAMPLE of them, drawn with the
    seed where there are more): opened, or built. Keyed by the text stores and the sample."""
    sampled = sum(text.size("train") for text in texts) > TERM_SAMPLE
    key = {"format": STORE_FORMAT, "texts": [text.folder.name for text in texts], "sample": TERM_SAMPLE,
           "seed": config["seed"] if sampled else None, "links": [MIN_PAIRS, DICE, RENDERINGS]}
    folder = _store_folder(config, corpora(config)[0], "terms", key)
    return TermStore.open_or_build(folder, key, partial(_fill_term_store, config=config, texts=texts),
                                   f"aligning the words of the training pairs into {folder}")


def _fill_term_store(folder: Path, config: dict[str, Any], texts: Sequence[TextStore]) -> dict[str, Any]:
    rendered = renderings(dice_table(train_sample(config, texts, TERM_SAMPLE)))
    (folder / TERMS_FILE).write_text(json.dumps(rendered, ensure_ascii=False), encoding="utf-8")
    return {"source_words": len(rendered)}


# ---------------------------------------------------------------------------- the token store

class TokenStore(Store):
    """The token ids of each split's pairs that fit the model."""

    def dataset(self, split: str) -> BilingualDataset:
        arrays = PairArrays.open(self.folder, split, np.dtype(self.meta["dtype"]))
        return BilingualDataset(arrays.src, arrays.tgt, arrays.offsets)


def token_store(config: dict[str, Any], text: TextStore, tok_src: Tokenizer, tok_tgt: Tokenizer,
                corpus: Corpus | None = None) -> TokenStore:
    """The token store of `text`, the text store of `corpus` (the first by default), under these
    tokenizers and seq_len: opened, or built. A tagged corpus's source rows start with its tag's id,
    so the tag counts toward seq_len like any token."""
    corpus = corpus or corpora(config)[0]
    tag = tag_id(tok_src, corpus.tag, "this run") if corpus.tag else None
    key = {"format": STORE_FORMAT, "text": text.folder.name, "source_tokenizer": tokenizer_hash(tok_src),
           "target_tokenizer": tokenizer_hash(tok_tgt), "seq_len": config["seq_len"],
           "filter_max_length_ratio": config["filter_max_length_ratio"],
           "typed_special_tokens": "text"}  # stores that read a typed [EOS] or <2fr> as that token are not reused
    if corpus.tag:
        key["tag"] = corpus.tag
    annotator = None
    if config["term_annotation"]:
        terms = term_store(config, [text])
        annotator = TermAnnotator(terms.word_list(), config["term_annotation"], config["seed"],
                                  tuple(tag_id(tok_src, tag, "this run") for tag in TERM_TAGS))
        key.update(term_annotation=config["term_annotation"], terms=terms.folder.name, seed=config["seed"])
    folder = _store_folder(config, corpus, "tokens", key)
    return TokenStore.open_or_build(folder, key, partial(_fill_token_store, text=text, config=config, tok_src=tok_src,
                                                         tok_tgt=tok_tgt, tag=tag, annotator=annotator),
                                    f"tokenizing into the data store {folder}")


@dataclass
class TermAnnotator:
    """term_annotation's share of a store's training pairs, drawn with the run's seed, annotated
    (terms.py); the others as they are."""

    word_list: WordList
    share: float
    seed: int
    tags: tuple[int, int, int]
    annotated: int = 0
    terms: int = 0

    def encode(self, tok_src: Tokenizer, pairs: Sequence[Pair], start: int) -> tuple[list[list[int]], list[str]]:
        """The source ids and target texts of `pairs`, the rows from `start` of the training split."""
        rng = np.random.default_rng([self.seed, start])
        drawn = rng.random(len(pairs)) < self.share
        found = [self.word_list.annotation(s, t, rng) if pick else ([], t) for (s, t), pick in zip(pairs, drawn)]
        sources = [e.ids for e in encode_texts(tok_src, [s for s, _ in pairs], ids_only=True)]
        rows = [i for i, (spans, _) in enumerate(found) if spans]
        for i, ids in zip(rows, annotated_ids(tok_src, [pairs[i][0] for i in rows], [found[i][0] for i in rows],
                                              self.tags)):
            sources[i] = ids
        self.annotated += len(rows)
        self.terms += sum(len(found[i][0]) for i in rows)
        return sources, [target for _, target in found]


def token_stores(config: dict[str, Any], texts: Sequence[TextStore], tok_src: Tokenizer,
                 tok_tgt: Tokenizer) -> list[TokenStore]:
    """The token store of every corpus, each of `texts` (`text_stores`) with its corpus's tag."""
    return [token_store(config, text, tok_src, tok_tgt, corpus) for corpus, text in zip(corpora(config), texts)]


def _fill_token_store(folder: Path, text: TextStore, config: dict[str, Any], tok_src: Tokenizer,
                      tok_tgt: Tokenizer, tag: int | None, annotator: TermAnnotator | None = None) -> dict[str, Any]:
    dtype = smallest_id_type(max(tok_src.get_vocab_size(), tok_tgt.get_vocab_size()))
    seq_len, ratio = config["seq_len"], config["filter_max_length_ratio"]
    prefix = [] if tag is None else [tag]  # the tag is a source token like any other, but not part of the sentence
    splits = {}
    for split in text.splits():
        writer = PairWriter(folder, split, dtype)
        too_long = unbalanced = 0
        for start, pairs in zip(range(0, text.size(split), ENCODE_BATCH), text.iter_pairs(split)):
            if annotator is not None and split == "train":
                src, targets = annotator.encode(tok_src, pairs, start)
            else:
                src, targets = [e.ids for e in encode_texts(tok_src, [s for s, _ in pairs], ids_only=True)], \
                    [t for _, t in pairs]
            tgt = [e.ids for e in encode_texts(tok_tgt, targets, ids_only=True)]
            keep = []
            for s, t in zip(src, tgt):
                if not fits(len(prefix) + len(s), len(t), seq_len):
                    too_long += 1
                elif split == "train" and ratio and max(len(s), len(t)) > ratio * max(1, min(len(s), len(t))):
                    unbalanced += 1
                else:
                    keep.append((s, t))
            writer.add([prefix + s for s, _ in keep], [t for _, t in keep])
        kept = writer.close()
        if too_long:
            log(f"{split}: dropped {too_long} of {text.size(split)} pairs longer than seq_len {seq_len}")
        if unbalanced:
            log(f"filter_max_length_ratio: dropped {unbalanced} training pairs whose token lengths differ by more "
                f"than {ratio}x")
        splits[split] = {"pairs": kept, "too_long": too_long, "unbalanced": unbalanced}
    if annotator is not None:
        log(f"term_annotation: {annotator.annotated} of {text.size('train')} training sources annotated with "
            f"{annotator.terms} terms")
        splits["train"].update(annotated=annotator.annotated, terms=annotator.terms)
    return {"dtype": dtype.name, "splits": splits}
