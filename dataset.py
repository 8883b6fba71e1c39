"""Sentence pairs in, batches of token ids out.

1. `open_source` opens a datasource: a Hub id or a local folder in Hub layout, read with
   `datasets` in streaming mode (row by row, never whole in memory), or plain parallel files (a
   PREFIX.SRC + PREFIX.TGT pair, a two-column TSV file, or a folder of train.*, validation.* (or
   valid.* / dev.*) and test.* in those forms; gzip, bzip2 or xz by suffix), read a line at a time
   in binary. Plain files that exist win over a Hub id of the same name. It fingerprints the source:
   a Hub dataset by the revision its files resolve to, local files by each one's path, size and
   modification time. `read_pairs` streams a split, keeping rows with two non-empty strings and
   counting the others by reason (a line that is not UTF-8, a TSV line without two columns); two
   files of different lengths end the read with one line naming both counts.
2. `carve` splits a source that has only a train split, with the run's seed: validation and test
   each get `val_fraction` / `test_fraction` of it up to `val_max_pairs` / `test_max_pairs`, and
   training pairs whose source sentence also appears in either are removed (opus_books repeats
   sentences, which would otherwise be trained on and then scored).
3. store.py keeps the pairs and their token ids on disk; `BilingualDataset` reads rows by index
   from flat arrays (memory-mapped from the store), so no list of all pairs or ids is ever built.
   `CorpusMix` puts several corpora's datasets side by side.
4. `BatchPlan` takes each corpus's share of an epoch by its weight w: round(w x n) of its n pairs,
   floor(w) full copies plus a draw of the fraction seeded with (seed, epoch, corpus number). It
   groups them into token-budget batches of sentences of similar length, in an order that is a
   function of (seed, epoch) alone; each global step takes world_size * accum_steps batches, and
   rank r takes every world_size-th one, so the data order depends on neither the world size nor
   a resume. One corpus of weight 1 is batched exactly as it was before corpora had weights.
"""
from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import math
import os
import socket
import sys
import zlib
from dataclasses import dataclass, field
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence
from urllib.parse import urlparse

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from tokenizer import EOS_ID, PAD_ID, SOS_ID

Pair = tuple[str, str]
SPLITS = ("train", "validation", "test")
READ_BATCH = 10_000  # rows per streamed batch: bounds memory, amortises the per-batch cost


class DataError(RuntimeError):
    """Data that cannot be loaded; the message says what to do."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _hub_reachable(timeout: float = 5.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def first_line(error: BaseException) -> str:
    """An error's message in one line (its type's name when it has none)."""
    return (str(error).splitlines() or [type(error).__name__])[0]


def _first_bad_json_line(folder: str) -> str | None:
    """Name the first line of a local JSON-lines file that is not valid JSON."""
    if not os.path.isdir(folder):
        return None
    for path in sorted(Path(folder).rglob("*.jsonl")):
        with open(path, encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    try:
                        json.loads(line)
                    except json.JSONDecodeError as error:
                        return f"{path}:{number} is not valid JSON ({error.msg})"
    return None


@dataclass(frozen=True)
class PlainSplit:
    """The plain files of one split: a TSV file whose two columns are in `languages`, or one file
    per language, `files[i]` in `languages[i]`."""

    files: tuple[str, ...]
    languages: tuple[str, str]


@dataclass
class Source:
    """One language pair of a datasource, opened for streaming: a Hub dataset or a folder in Hub
    layout (`builder`, datasets'), or plain parallel files (`plain`: each split's files)."""

    datasource: str
    pair: str
    fingerprint: str  # changes whenever the data can have changed
    splits: list[str]
    builder: Any = None
    plain: dict[str, PlainSplit] = field(default_factory=dict)

    def rows(self, split: str) -> Iterator[list[dict | str]]:
        """The rows of `split` in batches of READ_BATCH, each row with its `translation` field only
        (a line of plain files that is no pair at all: the reason); read errors become one-line
        DataErrors. Only that column becomes Python objects."""
        if split in self.plain:
            rows = _plain_rows(self.plain[split])
            while batch := list(islice(rows, READ_BATCH)):
                yield batch
            return
        files = [str(path) for path in (self.builder.config.data_files or {}).get(split, [])]
        if files and all(path.endswith(".parquet") and os.path.isfile(path) for path in files):
            yield from self._local_parquet_rows(files)
        else:
            yield from self._streamed_rows(split)

    def _local_parquet_rows(self, files: list[str]) -> Iterator[list[dict]]:
        """Local parquet files (opus_books' Hub layout) read one row group at a time with pyarrow, so
        memory is bounded by a row group. On a 4M-pair corpus the `datasets` stream of the same files
        held 1.4 GB by the end and pyarrow's iter_batches kept 100 MB more per million rows; this
        stays flat."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        for path in files:
            try:
                parquet = pq.ParquetFile(path)
                has_translation = "translation" in parquet.schema_arrow.names
                for group in range(parquet.num_row_groups):
                    table = parquet.read_row_group(group, columns=["translation"] if has_translation else [])
                    for batch in table.to_batches(max_chunksize=READ_BATCH):
                        yield ([{"translation": value} for value in batch.column(0).to_pylist()] if has_translation
                               else [{}] * batch.num_rows)
                    del table
            except (pa.ArrowException, OSError) as error:
                raise DataError(f"cannot read {path}: {first_line(error)}") from None

    def _streamed_rows(self, split: str) -> Iterator[list[dict]]:
        """Any other source (the Hub, JSON, CSV) through `datasets` in streaming mode, as Arrow
        batches whose `translation` column alone is decoded (its features turn the loader's
        JSON-typed fields, from mixed types in a JSON file, into values)."""
        import datasets
        stream = self.builder.as_streaming_dataset(split)
        features = stream.features
        wanted = datasets.Features({"translation": features["translation"]}) \
            if features is not None and "translation" in features else None
        try:
            for batch in stream.with_format("arrow").iter(batch_size=READ_BATCH):
                if "translation" not in batch.column_names:
                    yield [{}] * batch.num_rows
                    continue
                columns = batch.select(["translation"]).to_pydict()
                values = (wanted.decode_batch(columns) if wanted is not None else columns)["translation"]
                yield [{"translation": value} for value in values]
        except (ValueError, OSError, datasets.exceptions.DatasetGenerationError) as error:
            detail = _first_bad_json_line(self.datasource) or first_line(error)
            raise DataError(f"cannot read {self.datasource!r} ({self.pair}) {split}: {detail}") from None


# ---------------------------------------------------------------------------- plain parallel files

# Openers by suffix; config.COMPRESSION_SUFFIXES names the same suffixes for corpus names.
OPENERS: dict[str, Callable[..., BinaryIO]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
FOLDER_SPLITS = {"train": ("train",), "validation": ("validation", "valid", "dev"), "test": ("test",)}
PLAIN_SPLIT = "train"  # the one split of a single PREFIX or TSV file
BOM = b"\xef\xbb\xbf"
_END = object()  # what zip_longest gives for the missing lines of the shorter file


def _open_binary(path: str) -> BinaryIO:
    """A file for reading bytes, decompressed by its suffix. A compressed stream is put behind an
    io.BufferedReader, whose readline is C code: the stream's own is Python (300,000 gzipped pairs
    read in 1.8 s of CPU time instead of 2.0 s)."""
    opener = OPENERS.get(os.path.splitext(path)[1])
    return io.BufferedReader(opener(path, "rb")) if opener else open(path, "rb")


def _text_lines(path: str) -> Iterator[str | None]:
    """The lines of a plain or compressed file, ended by "\\n" alone (not str.splitlines, which also
    ends one at U+2028, a form feed and the like inside a sentence), without it or a UTF-8 BOM at the
    start of the file (the "\\r" of Windows line endings goes with the whitespace pair_of strips);
    None for a line that is not valid UTF-8. A file that cannot be read or decompressed, also
    halfway through, is one DataError line naming it."""
    try:
        with _open_binary(path) as handle:
            for number, line in enumerate(handle):
                line = line.removesuffix(b"\n")
                try:
                    yield (line.removeprefix(BOM) if number == 0 else line).decode("utf-8")
                except UnicodeDecodeError:
                    yield None
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else first_line(error)
        raise DataError(f"cannot read {path}: {reason}") from None


def _plain_row(languages: tuple[str, str], texts: Sequence[str | None]) -> dict | str:
    """A Hub-shaped row of two texts, or why there is none: pair_of checks it as any other row."""
    if texts[0] is None or texts[1] is None:
        return "invalid UTF-8"
    return {"translation": {languages[0]: texts[0], languages[1]: texts[1]}}


def _plain_rows(part: PlainSplit) -> Iterator[dict | str]:
    if len(part.files) == 1:
        yield from _tsv_rows(part.files[0], part.languages)
    else:
        yield from _line_pair_rows(part.files, part.languages)


def _line_pair_rows(files: tuple[str, ...], languages: tuple[str, str]) -> Iterator[dict | str]:
    """Line i of one file with line i of the other; files of different lengths end the read with one
    line naming both counts (the longer file is read to its end to count it)."""
    paired = extra = 0
    first = second = None
    for first, second in zip_longest(_text_lines(files[0]), _text_lines(files[1]), fillvalue=_END):
        if first is _END or second is _END:
            extra += 1
        else:
            paired += 1
            yield _plain_row(languages, (first, second))
    if extra:
        counts = (paired, paired + extra) if first is _END else (paired + extra, paired)
        raise DataError(f"{files[0]} has {counts[0]} lines but {files[1]} has {counts[1]}: line i of one must "
                        f"translate line i of the other")


def _tsv_rows(path: str, languages: tuple[str, str]) -> Iterator[dict | str]:
    """A row of each line of a two-column TSV file (an empty line is a row of two empty sides)."""
    for line in _text_lines(path):
        columns = [None, None] if line is None else line.split("\t") if line.strip() else ["", ""]
        yield _plain_row(languages, columns) if len(columns) == 2 else "not two TSV columns"


def _existing(candidates: Sequence[str]) -> str | None:
    """The one candidate that is a file, None when none is; two are ambiguous."""
    found = [path for path in candidates if os.path.isfile(path)]
    if len(found) > 1:
        raise DataError(f"both {found[0]} and {found[1]} exist: remove or rename one")
    return found[0] if found else None


def _compressed(path: str) -> list[str]:
    return [path, *(path + suffix for suffix in OPENERS)]


def _uncompressed_name(path: str) -> str:
    """`path` without a compression suffix: corpus.tsv.gz -> corpus.tsv."""
    stem, suffix = os.path.splitext(path)
    return stem if suffix in OPENERS else path


def tsv_languages(path: str, lang_src: str, lang_tgt: str) -> tuple[str, str]:
    """The languages of a TSV file's two columns: those its name gives (corpus.it-en.tsv: Italian,
    then English), so that one file serves both directions, else the run's source then target. A
    name that gives a pair sharing one language with the run's but not both is refused."""
    stem = os.path.basename(_uncompressed_name(path)).removesuffix(".tsv")
    named = stem.rsplit(".", 1)[-1].split("-") if "." in stem else []
    if len(named) != 2 or not {lang_src, lang_tgt} & set(named):
        return lang_src, lang_tgt
    if set(named) != {lang_src, lang_tgt}:
        raise DataError(f"{path} holds {'-'.join(named)} pairs by its name, not {lang_src}-{lang_tgt}")
    return named[0], named[1]


def _plain_split(stem: str, lang_src: str, lang_tgt: str) -> PlainSplit | None:
    """The files of PREFIX `stem`: STEM.tsv, STEM.SRC-TGT.tsv or STEM.TGT-SRC.tsv, or STEM.SRC +
    STEM.TGT, each optionally compressed; None when there are none. One side alone, or two forms at
    once, is a DataError."""
    tsv = _existing([path for middle in ("", f".{lang_src}-{lang_tgt}", f".{lang_tgt}-{lang_src}")
                     for path in _compressed(f"{stem}{middle}.tsv")])
    sides = [_existing(_compressed(f"{stem}.{lang}")) for lang in (lang_src, lang_tgt)]
    if tsv and any(sides):
        raise DataError(f"both {tsv} and {next(side for side in sides if side)} exist: remove or rename one")
    if tsv:
        return PlainSplit((tsv,), tsv_languages(tsv, lang_src, lang_tgt))
    if any(sides) and not all(sides):
        tried = _compressed(f"{stem}.{lang_tgt if sides[0] else lang_src}")
        raise DataError(f"found {sides[0] or sides[1]} but not {tried[0]} (tried {', '.join(tried)})")
    return PlainSplit((sides[0], sides[1]), (lang_src, lang_tgt)) if all(sides) else None


def _folder_splits(folder: str, lang_src: str, lang_tgt: str) -> dict[str, PlainSplit]:
    """The plain split files of a folder: train.*, validation.* (or valid.* / dev.*), test.*."""
    parts = {}
    for split, names in FOLDER_SPLITS.items():
        found = {name: part for name in names if (part := _plain_split(os.path.join(folder, name), lang_src, lang_tgt))}
        if len(found) > 1:
            raise DataError(f"{folder} holds {' and '.join(f'{name}.*' for name in found)}: both would be the "
                            f"{split} split; remove or rename one")
        parts.update({split: part for part in found.values()})
    return parts


def _plain_source(datasource: str, pair: str, parts: dict[str, PlainSplit]) -> Source:
    """A source of plain files, fingerprinted by each file's absolute path, size and modification time."""
    digest = hashlib.sha256(f"{pair}\n".encode())
    for split, part in sorted(parts.items()):
        for path in part.files:
            stat = os.stat(path)
            digest.update(f"{split} {os.path.abspath(path)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return Source(datasource, pair, digest.hexdigest(), sorted(parts), plain=parts)


def _tried(datasource: str, lang_src: str, lang_tgt: str) -> str:
    """The local files a datasource that names none was looked for as, in words."""
    if _uncompressed_name(datasource).endswith(".tsv"):
        return f"no file {datasource}"
    return (f"tried the folder {datasource}, {datasource}.tsv and {datasource}.{lang_src} + "
            f"{datasource}.{lang_tgt} (each also {', '.join(OPENERS)})")


def _may_be_hub_id(datasource: str) -> bool:
    """Whether a datasource that is not on disk can name a Hub dataset (owner/name): not a path
    that starts like one, goes deeper, lies in an existing folder or ends like a file."""
    if datasource.startswith((".", "/", "~")) or datasource.count("/") > 1 or "\\" in datasource:
        return False
    if "/" in datasource and os.path.isdir(datasource.split("/")[0]):
        return False
    return not datasource.endswith((".tsv", *OPENERS))


def _local_plain_source(datasource: str, pair: str) -> Source | None:
    """Plain files named by `datasource` (a TSV file, a PREFIX, or a folder of split files), None when
    it names none."""
    lang_src, lang_tgt = pair.split("-", 1)
    if os.path.isdir(datasource):
        parts = _folder_splits(datasource, lang_src, lang_tgt)
    elif os.path.isfile(datasource):
        name = _uncompressed_name(datasource)
        if name.endswith((f".{lang_src}", f".{lang_tgt}")):
            raise DataError(f"{datasource} is one side of a parallel pair: name its PREFIX, "
                            f"--datasource {name.rsplit('.', 1)[0]}")
        if not name.endswith(".tsv"):
            raise DataError(f"{datasource} is a file but not a TSV file (NAME.tsv, optionally {', '.join(OPENERS)})")
        parts = {PLAIN_SPLIT: PlainSplit((datasource,), tsv_languages(datasource, lang_src, lang_tgt))}
    else:
        part = _plain_split(datasource, lang_src, lang_tgt)
        parts = {PLAIN_SPLIT: part} if part else {}
    return _plain_source(datasource, pair, parts) if parts else None


def open_source(datasource: str, pair: str) -> Source:
    """The datasource's `pair` (e.g. "en-it"), its splits and fingerprint; a DataError with one line
    when it cannot be opened. Reads no rows. Plain files that exist win over a Hub id of that name."""
    plain = _local_plain_source(datasource, pair)
    if plain is not None:
        return plain
    lang_src, lang_tgt = pair.split("-", 1)
    local = os.path.isdir(datasource)
    if not local:
        if not _may_be_hub_id(datasource):
            raise DataError(f"datasource {datasource!r} does not exist: {_tried(datasource, lang_src, lang_tgt)}")
        # The library retries an unreachable Hub for half a minute with a log line per try;
        # one quick probe turns that into one clear message. HF_HUB_OFFLINE=1 uses the local cache.
        if os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "") and not _hub_reachable():
            raise DataError(f"cannot reach the Hugging Face Hub to load {datasource!r}, and it is no local folder, "
                            f"PREFIX or TSV file; point --datasource at local files, e.g. "
                            f"python train.py --datasource ../shared/data/tatoeba")
    import datasets  # imported here: it is slow to import and only data preparation needs it
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # failures are reported by us, in one line
    datasets.disable_progress_bars()
    try:
        builder = datasets.load_dataset_builder(str(datasource), pair)
    except ValueError as error:
        if "BuilderConfig" in str(error) or "not found" in str(error).lower():
            available = str(error).split("Available:")[-1].strip() if "Available:" in str(error) else "?"
            raise DataError(f"{datasource!r} has no {pair} language pair (available: {available})") from None
        raise DataError(f"cannot load {datasource!r} ({pair}): {error}") from None
    except (ConnectionError, OSError, datasets.exceptions.DatasetNotFoundError) as error:
        where = "" if local else f"; no local files either ({_tried(datasource, lang_src, lang_tgt)})"
        raise DataError(f"cannot load {datasource!r} ({pair}): {first_line(error)}{where}") from None
    files = sorted((split, str(name)) for split, names in (builder.config.data_files or {}).items() for name in names)
    digest = hashlib.sha256(f"{pair}\n".encode())
    for split, name in files:
        # Hub files resolve to URLs that name the dataset's revision; local files change their
        # size or modification time when edited.
        stat = f"{os.stat(name).st_size} {os.stat(name).st_mtime_ns}" if local else ""
        digest.update(f"{split} {name} {stat}\n".encode())
    return Source(str(datasource), pair, digest.hexdigest(), sorted({split for split, _ in files}), builder)


def pair_of(row: Any, lang_src: str, lang_tgt: str) -> Pair | str:
    """The stripped (source, target) of a row, or why it is unusable."""
    if isinstance(row, str):
        return row  # a line of plain files that is no row: why
    translation = row.get("translation") if isinstance(row, dict) else None
    if not isinstance(translation, dict):
        return "no translation field"
    src, tgt = translation.get(lang_src), translation.get(lang_tgt)
    if src is None or tgt is None:
        return "missing side"
    if not isinstance(src, str) or not isinstance(tgt, str):
        return "non-text side"
    src, tgt = src.strip(), tgt.strip()
    if not src or not tgt:
        return "empty side"
    return src, tgt


def read_pairs(source: Source, split: str, lang_src: str, lang_tgt: str) -> Iterator[list[Pair]]:
    """The usable pairs of `split` in batches; skipped rows are counted by reason and reported."""
    skipped: dict[str, int] = {}
    rows = 0
    for batch in source.rows(split):
        pairs = []
        for row in batch:
            found = pair_of(row, lang_src, lang_tgt)
            if isinstance(found, str):
                skipped[found] = skipped.get(found, 0) + 1
            else:
                pairs.append(found)
        rows += len(batch)
        yield pairs
    if skipped:
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))
        log(f"{split}: skipped {sum(skipped.values())} of {rows} rows ({detail})")


def read_all_pairs(source: Source, split: str, lang_src: str, lang_tgt: str) -> list[Pair]:
    """Every usable pair of `split` in one list: for held-out files and evaluation, not a training corpus."""
    return [pair for batch in read_pairs(source, split, lang_src, lang_tgt) for pair in batch]


def text_hash(text: str) -> int:
    """A stable 64-bit hash of a sentence (the same in every process, unlike hash())."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def held_out_sizes(n: int, config: dict[str, Any], missing: Sequence[str]) -> dict[str, int]:
    """How many of `n` training pairs become each missing held-out split: a fraction, capped."""
    sizes = {}
    for name, fraction, ceiling in (("validation", config["val_fraction"], config["val_max_pairs"]),
                                    ("test", config["test_fraction"], config["test_max_pairs"])):
        sizes[name] = min(round(n * fraction), ceiling) if name in missing else 0
    return sizes


def carve(source_hashes: np.ndarray, config: dict[str, Any], missing: Sequence[str]) -> dict[str, np.ndarray]:
    """Row indices of train and of each `missing` held-out split, out of the `len(source_hashes)`
    training pairs (hashes of their source sentences), with the run's seed. Training pairs whose
    source sentence is also held out are removed from train."""
    n = len(source_hashes)
    sizes = held_out_sizes(n, config, missing)
    order = np.random.default_rng(config["seed"]).permutation(n)
    n_test, n_val = sizes["test"], sizes["validation"]
    parts = {"test": np.sort(order[:n_test]), "validation": np.sort(order[n_test:n_test + n_val]),
             "train": np.sort(order[n_test + n_val:])}
    held_out = np.concatenate([parts[name] for name in missing])
    if len(held_out):
        overlap = np.isin(source_hashes[parts["train"]], source_hashes[held_out])
        if overlap.any():
            log(f"removed {int(overlap.sum())} training pairs whose source sentence is also in the held-out "
                f"{' or '.join(missing)} split")
            parts["train"] = parts["train"][~overlap]
    return {name: parts[name] for name in ["train", *missing]}


# ---------------------------------------------------------------------------- tokenized rows

class BilingualDataset(Dataset):
    """Token ids of sentence pairs (without [SOS]/[EOS]) that fit in seq_len, read by index from
    flat arrays: all source ids end to end, all target ids end to end, and `offsets` (2, n + 1)
    where row i is src_ids[offsets[0, i]:offsets[0, i + 1]] and likewise for the target."""

    def __init__(self, src_ids: np.ndarray, tgt_ids: np.ndarray, offsets: np.ndarray) -> None:
        self.src_ids, self.tgt_ids, self.offsets = src_ids, tgt_ids, offsets
        # Source gets [SOS] .. [EOS]; target input gets [SOS] .., labels .. [EOS].
        self.src_lens = np.diff(offsets[0]).astype(np.int64) + 2
        self.tgt_lens = np.diff(offsets[1]).astype(np.int64) + 1

    @classmethod
    def from_pairs(cls, pairs: Sequence[Pair], tok_src: Tokenizer, tok_tgt: Tokenizer, seq_len: int,
                   name: str = "pairs") -> "BilingualDataset":
        """Tokenize a small list of pairs in memory (tests, benchmarks); pairs longer than
        seq_len are dropped and counted. Training data goes through store.py instead."""
        src = [e.ids for e in tok_src.encode_batch([p[0] for p in pairs], add_special_tokens=False)]
        tgt = [e.ids for e in tok_tgt.encode_batch([p[1] for p in pairs], add_special_tokens=False)]
        keep = [i for i in range(len(pairs)) if fits(len(src[i]), len(tgt[i]), seq_len)]
        if len(keep) < len(pairs):
            log(f"{name}: dropped {len(pairs) - len(keep)} of {len(pairs)} pairs longer than seq_len {seq_len}")
        offsets = np.zeros((2, len(keep) + 1), dtype=np.int64)
        offsets[0, 1:] = np.cumsum([len(src[i]) for i in keep])
        offsets[1, 1:] = np.cumsum([len(tgt[i]) for i in keep])
        flat = [np.array([t for i in keep for t in side[i]], dtype=np.int64) for side in (src, tgt)]
        return cls(flat[0], flat[1], offsets)

    def __len__(self) -> int:
        return len(self.src_lens)

    @property
    def corpus_sizes(self) -> list[int]:
        """The number of rows of each corpus the dataset holds, in order: one corpus here."""
        return [len(self)]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.offsets[:, index], self.offsets[:, index + 1]
        return self.src_ids[start[0]:end[0]], self.tgt_ids[start[1]:end[1]]

    def collate(self, indices: Sequence[int], pad_multiple: int = 1, seq_len: int = 0) -> dict[str, torch.Tensor]:
        """Pad to the longest sentence of the batch, padding on the right, and to a multiple of
        `pad_multiple` positions no longer than `seq_len` (on CUDA, 8: tensor cores take matrix
        sides in multiples of 8; the batch is the same, so the plan and resume are untouched). A
        `src_mask` (B, 1, 1, S), True on real positions, only when some source is padded; no target
        mask: the decoder is causal when given none, which is all training needs (model.py's
        docstring), and the loss ignores padded labels. So attention takes the fused kernels that
        accept no mask tensor wherever a batch allows it."""
        src_len = padded_length(int(self.src_lens[indices].max()), pad_multiple, seq_len)
        tgt_len = padded_length(int(self.tgt_lens[indices].max()), pad_multiple, seq_len)
        encoder_input = torch.full((len(indices), src_len), PAD_ID, dtype=torch.long)
        decoder_input = torch.full((len(indices), tgt_len), PAD_ID, dtype=torch.long)
        label = torch.full((len(indices), tgt_len), PAD_ID, dtype=torch.long)
        for row, index in enumerate(indices):
            src, tgt = (torch.from_numpy(ids.astype(np.int64)) for ids in self[int(index)])
            encoder_input[row, 0], encoder_input[row, 1:len(src) + 1], encoder_input[row, len(src) + 1] = \
                SOS_ID, src, EOS_ID
            decoder_input[row, 0], decoder_input[row, 1:len(tgt) + 1] = SOS_ID, tgt
            label[row, :len(tgt)], label[row, len(tgt)] = tgt, EOS_ID
        batch = {"encoder_input": encoder_input, "decoder_input": decoder_input, "label": label}
        if bool((self.src_lens[indices] < src_len).any()):
            batch["src_mask"] = (encoder_input != PAD_ID)[:, None, None, :]
        return batch


def padded_length(longest: int, multiple: int, seq_len: int) -> int:
    """`longest` rounded up to a multiple of `multiple`, but never past `seq_len` (nor below `longest`)."""
    return max(longest, min(-(-longest // multiple) * multiple, seq_len))


class CorpusMix(BilingualDataset):
    """Several corpora's datasets side by side, batched and collated as one: row k of corpus i is row
    `starts[i] + k`. Each keeps its own (memory-mapped) arrays; only the lengths are concatenated."""

    def __init__(self, parts: Sequence[BilingualDataset]) -> None:
        # Not BilingualDataset.__init__, which takes one corpus's flat arrays: collate needs only the
        # lengths and __getitem__.
        self.parts = list(parts)
        self.starts = np.cumsum([0, *(len(part) for part in self.parts)])
        self.src_lens = np.concatenate([part.src_lens for part in self.parts])
        self.tgt_lens = np.concatenate([part.tgt_lens for part in self.parts])

    @property
    def corpus_sizes(self) -> list[int]:
        return [len(part) for part in self.parts]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        part = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self.parts[part][index - int(self.starts[part])]


def fits(src_tokens: int, tgt_tokens: int, seq_len: int) -> bool:
    """Whether a pair fits the model with its special tokens: [SOS] src [EOS], and [SOS] tgt / tgt [EOS]."""
    return src_tokens + 2 <= seq_len and tgt_tokens + 1 <= seq_len


# ---------------------------------------------------------------------------- batching

def token_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Sort by length (random among equals), cut into batches whose padded size fits the budget,
    then shuffle the batches. A sentence longer than the budget gets a batch of its own."""
    tie_break = rng.random(len(src_lens))
    longest_side = np.maximum(src_lens, tgt_lens)
    # Target length as a key too: sorting by (longest side, source) alone leaves the shorter
    # target side ragged within a batch, about 12% padding on tatoeba instead of under 9%.
    order = np.lexsort((tie_break, tgt_lens, src_lens, longest_side))
    longest = longest_side[order]  # non-decreasing: a batch's padded length is its last sentence's
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        # Everything after `start` is at least as long, so a batch holds at most budget // longest[start].
        window = longest[start:start + batch_tokens // longest[start] + 1]
        over = window * np.arange(1, len(window) + 1) > batch_tokens
        over[0] = False
        end = start + (int(np.argmax(over)) if over.any() else len(window))
        batches.append(order[start:end])
        start = end
    return [batches[i] for i in rng.permutation(len(batches))]


def padding_waste(batches: Sequence[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Fraction of the padded source and target positions that are padding."""
    real = padded = 0
    for batch in batches:
        real += int(src_lens[batch].sum() + tgt_lens[batch].sum())
        padded += len(batch) * int(src_lens[batch].max() + tgt_lens[batch].max())
    return 1.0 - real / padded if padded else 0.0


@dataclass
class BatchPlan:
    """Which rows each epoch takes from each corpus of `dataset` (by `weights`, one per corpus), which
    micro-batches each rank trains on, and how many tokens each step has."""

    dataset: BilingualDataset
    batch_tokens: int
    seed: int
    world_size: int = 1
    rank: int = 0
    accum_steps: int = 1
    weights: Sequence[float] = (1.0,)

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.dataset.corpus_sizes):
            raise ValueError(f"{len(self.weights)} weights for {len(self.dataset.corpus_sizes)} corpora")
        self._cached: tuple[int, list[np.ndarray]] | None = None

    @property
    def per_step(self) -> int:
        return self.world_size * self.accum_steps

    def corpus_pairs(self) -> list[int]:
        """How many pairs each corpus gives every epoch: round(weight x its pairs)."""
        return [round(weight * size) for weight, size in zip(self.weights, self.dataset.corpus_sizes)]

    def epoch_rows(self, epoch: int) -> np.ndarray:
        """The dataset's rows that epoch `epoch` trains on, corpus by corpus: floor(w) full copies of
        a corpus, then the rest of its round(w x n) drawn without replacement, seeded with (seed,
        epoch, corpus number from 1) so that the mix depends on nothing else."""
        sizes = self.dataset.corpus_sizes
        starts = np.cumsum([0, *sizes])
        rows = []
        for index, (start, size, weight, total) in enumerate(zip(starts, sizes, self.weights, self.corpus_pairs())):
            copies = math.floor(weight)
            rows += [np.arange(start, start + size)] * copies
            if total > copies * size:
                # index + 1: numpy pads a seed with zeros, so [seed, epoch, 0] would replay the stream of
                # [seed, epoch], which orders the batches
                drawn = np.random.default_rng([self.seed, epoch, index + 1]).choice(size, total - copies * size, False)
                rows.append(start + np.sort(drawn))
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if self._cached is None or self._cached[0] != epoch:
            rows = self.epoch_rows(epoch)
            rng = np.random.default_rng([self.seed, epoch])
            batches = token_batches(self.dataset.src_lens[rows], self.dataset.tgt_lens[rows], self.batch_tokens, rng)
            self._cached = (epoch, [rows[batch] for batch in batches])
        return self._cached[1]

    def steps_per_epoch(self, epoch: int, start_batch: int = 0) -> int:
        """Optimizer steps in the epoch from batch `start_batch` on (a trailing partial step is dropped)."""
        return (len(self.epoch_batches(epoch)) - start_batch) // self.per_step

    def micro_batches(self, epoch: int, start_batch: int = 0) -> list[tuple[np.ndarray, int]]:
        """This rank's micro-batches from the epoch's batch `start_batch` on, each with the number of
        target tokens of its whole global step (all ranks, all accumulated micro-batches), which
        normalises the loss so that any split of a step gives the same gradient."""
        batches = self.epoch_batches(epoch)
        plan = []
        for step in range(self.steps_per_epoch(epoch, start_batch)):
            first = start_batch + step * self.per_step
            step_batches = batches[first:first + self.per_step]
            step_tokens = int(sum(self.dataset.tgt_lens[b].sum() for b in step_batches))
            plan.extend((b, step_tokens) for b in step_batches[self.rank::self.world_size])
        return plan


class MicroBatches(Dataset):
    """A DataLoader-ready view of one rank's planned micro-batches (collated in the workers)."""

    def __init__(self, dataset: BilingualDataset, plan: list[tuple[np.ndarray, int]], pad_multiple: int = 1,
                 seq_len: int = 0) -> None:
        self.dataset = dataset
        self.plan = plan
        self.pad_multiple, self.seq_len = pad_multiple, seq_len

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        indices, step_tokens = self.plan[index]
        batch = self.dataset.collate(indices, self.pad_multiple, self.seq_len)
        batch["step_tokens"] = torch.tensor(step_tokens)
        batch["num_tokens"] = torch.tensor(int(self.dataset.tgt_lens[indices].sum()))
        return batch
