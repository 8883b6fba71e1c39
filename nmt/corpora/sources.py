"""Raw corpora in, usable sentence pairs out: the first stage of the data path (sources.py ->
store.py -> dataset.py).

1. `open_source` opens a datasource: a Hub id or a local folder in Hub layout, read with
   `datasets` in streaming mode (row by row, never whole in memory; a pair it names only the other
   way round, it-en where it has en-it, is read from that config, sides swapped), or plain parallel
   files (a PREFIX.SRC + PREFIX.TGT pair, a two-column TSV file, or a folder of train.*,
   validation.* (or valid.* / dev.*) and test.* in those forms; gzip, bzip2 or xz by suffix), read
   a line at a time in binary, none held in more than `max_line_bytes`. Plain files that exist win
   over a Hub id of the same name; language codes are BCP 47's (pt-BR, zh-Hant), and a TSV file's
   name gives its columns' languages only by naming the run's pair whole (`tsv_languages`). A
   symbolic link that leads nowhere is named as such. `Source.fingerprint` is the source's identity
   by content: a Hub dataset by the revision its files resolve to, local files by the sha256 of
   their bytes (file_digests.py), with the split and languages each is read as. `read_pairs` streams
   a split, keeping rows with two non-empty strings and counting the others by reason (a line
   longer than `max_line_bytes`, a TSV line without two columns). Files are UTF-8, with or without
   a byte-order mark (never part of the first sentence): a line that is not UTF-8 refuses its file
   in one line naming the file and the line, and so does a UTF-16 byte-order mark or a NUL byte
   (and, in a Hub folder's files, a line that is not JSON); two files of different lengths end the
   read with one line naming both counts, and so does a TSV file most of whose lines are no pairs.
2. `carve` splits a source that has only a train split, with the run's seed: validation and test
   each get `val_fraction` / `test_fraction` of it up to `val_max_pairs` / `test_max_pairs`, and
   training pairs whose source sentence also appears in either are removed (opus_books repeats
   sentences, which would otherwise be trained on and then scored).
store.py keeps the pairs and their token ids on disk; dataset.py batches the token ids.
"""
from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import socket
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice, zip_longest
from typing import Any, BinaryIO, Callable, Iterator, Sequence
from urllib.parse import urlparse

import numpy as np

from config import OPTIONS
from nmt.diagnostics import first_line, log
from nmt.corpora.file_digests import ColumnsError, FileDigests

Pair = tuple[str, str]
SPLITS = ("train", "validation", "test")
READ_BATCH = 10_000  # rows per streamed batch: bounds memory, amortises the per-batch cost
MAX_LINE_BYTES = OPTIONS["max_line_bytes"].default
TOO_LONG = "longer than max_line_bytes"
# Rows skipped for these reasons say the file is no text of pairs; more than half of them refuse it.
UNREADABLE = ("not two TSV columns",)


class DataError(RuntimeError):
    """Data that cannot be loaded; the message says what to do."""


def _hub_reachable(timeout: float = 5.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _first_bad_line(files: Sequence[str]) -> str | None:
    """Name the first line of the local files of a split (each optionally compressed) that is not
    UTF-8, or, in a JSON-lines file, not valid JSON; a UTF-8 BOM at the start of a file is allowed."""
    for path in filter(os.path.isfile, files):
        json_lines = _uncompressed_name(path).endswith(".jsonl")
        try:
            with _open_binary(path) as handle:
                for number, raw in enumerate(handle, start=1):
                    raw = raw.removeprefix(BOM) if number == 1 else raw
                    try:
                        line = raw.decode("utf-8")
                        if json_lines and line.strip():
                            json.loads(line)
                    except UnicodeDecodeError as error:
                        return _not_utf8(path, number, raw, error)
                    except json.JSONDecodeError as error:
                        return f"{path}:{number} is not valid JSON ({error.msg})"
        except (OSError, EOFError, zlib.error, lzma.LZMAError):
            continue  # what the library said is all there is to say of it
    return None


@dataclass(frozen=True)
class PlainSplit:
    """The plain files of one split: a TSV file whose two columns are in `languages`, or one file
    per language, `files[i]` in `languages[i]`."""

    files: tuple[str, ...]
    languages: tuple[str, str]
    named: bool = True  # False: a TSV file whose name gives no languages, read in the run's order


@dataclass
class Source:
    """One language pair of a datasource, opened for streaming: a Hub dataset or a folder in Hub
    layout (`builder`, datasets'), or plain parallel files (`plain`: each split's files). Lines and
    texts longer than `max_line_bytes` are skipped, and never held whole when read from plain files."""

    datasource: str
    languages: tuple[str, str]
    splits: list[str]
    builder: Any = None
    plain: dict[str, PlainSplit] = field(default_factory=dict)
    max_line_bytes: int = MAX_LINE_BYTES
    digests: FileDigests = field(default_factory=FileDigests)

    @property
    def pair(self) -> str:
        """The language pair as the Hub names its configs: en-it, pt-BR-en."""
        return "-".join(self.languages)

    @cached_property
    def fingerprint(self) -> str:
        """What the source holds, by content: the same for the same bytes wherever they lie, another
        for any other bytes. Local files by the sha256 of their content (`FileDigests`, read again
        only when their stat values change), each with the split and languages it is read as; a Hub
        dataset by the revision its files resolve to. A TSV file whose name gives no languages is
        refused when an earlier run read its columns the other way (`FileDigests.check_columns`)."""
        digest = hashlib.sha256(json.dumps(self.languages).encode())
        try:
            for split, part in sorted(self.plain.items()):
                for path, language in zip(part.files, part.languages if len(part.files) > 1 else ["tsv"]):
                    content = self.digests.digest(path)
                    if not part.named:
                        self.digests.check_columns(content, part.languages, path)
                    columns = f"{part.languages[0]} {part.languages[1]}" if language == "tsv" else language
                    digest.update(f"{split} {columns} {content}\n".encode())
            for split, name in self._hub_files():
                # Hub files resolve to URLs that name the dataset's revision; local ones are hashed.
                digest.update(f"{split} {self.digests.digest(name) if os.path.isfile(name) else name}\n".encode())
        except OSError as error:
            raise DataError(f"cannot read {error.filename}: {error.strerror or error}") from None
        except ColumnsError as error:
            raise DataError(str(error)) from None
        return digest.hexdigest()

    def _hub_files(self) -> list[tuple[str, str]]:
        if self.builder is None:
            return []
        return sorted((split, str(name)) for split, names in (self.builder.config.data_files or {}).items()
                      for name in names)

    def rows(self, split: str) -> Iterator[list[dict | str]]:
        """The rows of `split` in batches of READ_BATCH, each row with its `translation` field only
        (a line of plain files that is no pair at all: the reason); read errors become one-line
        DataErrors. Only that column becomes Python objects."""
        if split in self.plain:
            rows = _plain_rows(self.plain[split], self.max_line_bytes)
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
            files = [str(path) for path in (self.builder.config.data_files or {}).get(split, [])]
            detail = _first_bad_line(files) or first_line(error)
            raise DataError(f"cannot read {self.datasource!r} ({self.pair}) {split}: {detail}") from None


# ---------------------------------------------------------------------------- plain parallel files

# Openers by suffix; config.COMPRESSION_SUFFIXES names the same suffixes for corpus names.
OPENERS: dict[str, Callable[..., BinaryIO]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
FOLDER_SPLITS = {"train": ("train",), "validation": ("validation", "valid", "dev"), "test": ("test",)}
PLAIN_SPLIT = "train"  # the one split of a single PREFIX or TSV file
BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # also the start of UTF-32's
_END = object()  # what zip_longest gives for the missing lines of the shorter file
_LONG = object()  # a line longer than max_line_bytes, not read into memory


def _open_binary(path: str) -> BinaryIO:
    """A file for reading bytes, decompressed by its suffix. A compressed stream is put behind an
    io.BufferedReader, whose readline is C code: the stream's own is Python, and slower."""
    opener = OPENERS.get(os.path.splitext(path)[1])
    return io.BufferedReader(opener(path, "rb")) if opener else open(path, "rb")


def bounded_lines(handle: BinaryIO, max_bytes: int) -> Iterator[bytes | None]:
    """The lines of `handle` without their "\\n", none held in more than max_bytes + 1 bytes: None
    for a line longer than `max_bytes`, whose rest is read past in pieces of that size."""
    while line := handle.readline(max_bytes + 1):
        if line.endswith(b"\n"):
            yield line[:-1]
        elif len(line) <= max_bytes:
            yield line  # the last line, without a "\n"
        else:
            while (rest := handle.readline(max_bytes + 1)) and not rest.endswith(b"\n"):
                pass
            yield None


def _text_lines(path: str, max_bytes: int) -> Iterator[str | object]:
    """The lines of a plain or compressed file, ended by "\\n" alone (not str.splitlines, which also
    ends one at U+2028, a form feed and the like inside a sentence), without it or a UTF-8 BOM at the
    start of the file (the "\\r" of Windows line endings goes with the whitespace pair_of strips);
    _LONG for a line longer than `max_bytes` (never held whole). A file that is not UTF-8 (a line
    that does not decode, a UTF-16 byte-order mark, a NUL byte) is refused: one DataError line naming
    the file and the line, as is a file that cannot be read or decompressed, also halfway through."""
    try:
        with _open_binary(path) as handle:
            for number, line in enumerate(bounded_lines(handle, max_bytes)):
                if line is None:
                    yield _LONG
                    continue
                if number == 0 and line.startswith(UTF16_BOMS):
                    raise DataError(f"{path} is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8: convert "
                                    f"it first, e.g. {_conversion(path, 'UTF-16')}")
                if b"\0" in line:
                    raise DataError(f"{path} holds a NUL byte on line {number + 1}: it is no UTF-8 text (UTF-16 "
                                    f"without a byte-order mark, or a binary file?)")
                if number == 0:
                    line = line.removeprefix(BOM)
                try:
                    yield line.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataError(_not_utf8(path, number + 1, line, error)) from None
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else first_line(error)
        raise DataError(f"cannot read {path}: {reason}") from None


def _not_utf8(path: str, number: int, line: bytes, error: UnicodeDecodeError) -> str:
    """One line saying that line `number` of `path` is not UTF-8, where, and how to convert the file."""
    return (f"{path}: line {number} is not UTF-8 (byte 0x{line[error.start]:02X} at byte {error.start + 1} of the "
            f"line): save the file as UTF-8, e.g. from Windows-1252 or Latin-1: {_conversion(path, 'CP1252')}")


def _conversion(path: str, encoding: str) -> str:
    """The command that converts `path` from `encoding` to UTF-8, decompressing it first."""
    target = f"{_uncompressed_name(path)}.utf8"
    reader = {".gz": "zcat", ".bz2": "bzcat", ".xz": "xzcat"}.get(os.path.splitext(path)[1])
    if reader:
        return f"{reader} {path} | iconv -f {encoding} -t UTF-8 > {target}"
    return f"iconv -f {encoding} -t UTF-8 {path} > {target}"


def _plain_row(languages: tuple[str, str], texts: Sequence[str | object]) -> dict | str:
    """A Hub-shaped row of two texts, or why there is none: pair_of checks it as any other row."""
    if texts[0] is _LONG or texts[1] is _LONG:
        return TOO_LONG
    return {"translation": {languages[0]: texts[0], languages[1]: texts[1]}}


def _plain_rows(part: PlainSplit, max_bytes: int) -> Iterator[dict | str]:
    if len(part.files) == 1:
        yield from _tsv_rows(part.files[0], part.languages, max_bytes)
    else:
        yield from _line_pair_rows(part.files, part.languages, max_bytes)


def _line_pair_rows(files: tuple[str, ...], languages: tuple[str, str], max_bytes: int) -> Iterator[dict | str]:
    """Line i of one file with line i of the other; files of different lengths end the read with one
    line naming both counts (the longer file is read to its end to count it)."""
    paired = extra = 0
    first = second = None
    for first, second in zip_longest(_text_lines(files[0], max_bytes), _text_lines(files[1], max_bytes),
                                     fillvalue=_END):
        if first is _END or second is _END:
            extra += 1
        else:
            paired += 1
            yield _plain_row(languages, (first, second))
    if extra:
        counts = (paired, paired + extra) if first is _END else (paired + extra, paired)
        raise DataError(f"{files[0]} has {counts[0]} lines but {files[1]} has {counts[1]}: line i of one must "
                        f"translate line i of the other")


def _tsv_rows(path: str, languages: tuple[str, str], max_bytes: int) -> Iterator[dict | str]:
    """A row of each line of a two-column TSV file (an empty line is a row of two empty sides)."""
    for line in _text_lines(path, max_bytes):
        columns = [line, line] if not isinstance(line, str) else line.split("\t") if line.strip() else ["", ""]
        yield _plain_row(languages, columns) if len(columns) == 2 else "not two TSV columns"


def check_link(path: str) -> None:
    """A DataError when `path` is a symbolic link that leads nowhere: a loop, or a missing target
    (either looks like no file at all to os.path.exists)."""
    if not os.path.islink(path) or os.path.exists(path):
        return
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise DataError(f"{path} is a symbolic link loop (it leads back to itself): point it at the data") \
                from None
    raise DataError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist")


def _existing(candidates: Sequence[str]) -> str | None:
    """The one candidate that is a file, None when none is; two are ambiguous."""
    for path in candidates:
        check_link(path)
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


# A language code as BCP 47 writes it (en, pt-BR, zh-Hant, sr-Latn, es-419), in the simple form file
# names use: a 2-3 letter language, then script, region and variant subtags.
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z]{4})?(-([A-Za-z]{2}|[0-9]{3}))?(-([A-Za-z0-9]{5,8}|[0-9][A-Za-z0-9]{3}))*")


def name_pair(path: str) -> str:
    """The part of a TSV file's name that may give its languages: corpus.it-en.tsv.gz -> it-en ("" for
    corpus.tsv)."""
    stem = os.path.basename(_uncompressed_name(path)).removesuffix(".tsv")
    return stem.rsplit(".", 1)[-1] if "." in stem else ""


def tsv_languages(path: str, lang_src: str, lang_tgt: str) -> tuple[str, str] | None:
    """The languages of a TSV file's two columns as its name gives them, so that one file serves both
    directions: NAME.SRC-TGT.tsv where SRC-TGT is the run's pair in either order, matched whole
    (corpus.it-en.tsv: Italian, then English; c.pt-BR-en.tsv: pt-BR, then en). None when the name
    gives no languages. A name whose last part reads as another language pair, in any way it can be
    cut into two codes (c.pt-BR-en.tsv for a pt-en run: pt-BR + en, or pt + BR-en), is refused
    rather than read in the run's order."""
    named = name_pair(path)
    for first, second in ((lang_src, lang_tgt), (lang_tgt, lang_src)):
        if named == f"{first}-{second}":
            return first, second
    parts = named.split("-")
    readings = [("-".join(parts[:cut]), "-".join(parts[cut:])) for cut in range(1, len(parts))]
    readings = [reading for reading in readings if all(LANGUAGE_CODE.fullmatch(code) for code in reading)]
    if readings:
        read = " or ".join(f"{first} then {second}" for first, second in readings)
        raise DataError(f"{path}: its name gives the languages of its columns as {read}, not {lang_src} and "
                        f"{lang_tgt}: name it NAME.{lang_src}-{lang_tgt}.tsv (or NAME.{lang_tgt}-{lang_src}.tsv) "
                        f"for its columns")
    return None


def _tsv_split(path: str, lang_src: str, lang_tgt: str) -> PlainSplit:
    """A TSV file's split: the columns its name gives, else the run's source then target."""
    named = tsv_languages(path, lang_src, lang_tgt)
    return PlainSplit((path,), named or (lang_src, lang_tgt), named is not None)


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
        return _tsv_split(tsv, lang_src, lang_tgt)
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


def _local_plain_parts(datasource: str, lang_src: str, lang_tgt: str) -> dict[str, PlainSplit]:
    """The split files `datasource` names (a TSV file, a PREFIX, or a folder of split files); none
    when it names none."""
    check_link(datasource)
    if os.path.isdir(datasource):
        parts = _folder_splits(datasource, lang_src, lang_tgt)
    elif os.path.isfile(datasource):
        name = _uncompressed_name(datasource)
        if name.endswith((f".{lang_src}", f".{lang_tgt}")):
            raise DataError(f"{datasource} is one side of a parallel pair: name its PREFIX, "
                            f"--datasource {name.rsplit('.', 1)[0]}")
        if not name.endswith(".tsv"):
            raise DataError(f"{datasource} is a file but not a TSV file (NAME.tsv, optionally {', '.join(OPENERS)})")
        parts = {PLAIN_SPLIT: _tsv_split(datasource, lang_src, lang_tgt)}
    else:
        part = _plain_split(datasource, lang_src, lang_tgt)
        parts = {PLAIN_SPLIT: part} if part else {}
    return parts


def open_source(datasource: str, lang_src: str, lang_tgt: str, max_line_bytes: int = MAX_LINE_BYTES,
                digests: FileDigests | None = None) -> Source:
    """The datasource's pair of `lang_src` and `lang_tgt` (language codes as BCP 47 writes them: en,
    pt-BR), its splits; a DataError with one line when it cannot be opened. Reads no rows; its
    `fingerprint` reads the files' content when `digests` (default: this process's alone) does not
    know it. Plain files that exist win over a Hub id of that name."""
    digests = digests if digests is not None else FileDigests()
    if parts := _local_plain_parts(datasource, lang_src, lang_tgt):
        return Source(datasource, (lang_src, lang_tgt), sorted(parts), plain=parts, max_line_bytes=max_line_bytes,
                      digests=digests)
    pair = f"{lang_src}-{lang_tgt}"
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
        builder = _pair_builder(datasets, datasource, lang_src, lang_tgt)
    except (ConnectionError, OSError, datasets.exceptions.DatasetNotFoundError) as error:
        where = "" if local else f"; no local files either ({_tried(datasource, lang_src, lang_tgt)})"
        raise DataError(f"cannot load {datasource!r} ({pair}): {first_line(error)}{where}") from None
    splits = sorted({str(split) for split, names in (builder.config.data_files or {}).items() for _ in names})
    return Source(str(datasource), (lang_src, lang_tgt), splits, builder, max_line_bytes=max_line_bytes,
                  digests=digests)


def _pair_builder(datasets: Any, datasource: str, lang_src: str, lang_tgt: str) -> Any:
    """datasets' builder of `datasource`'s config of the pair, or else of the reversed pair's: a
    folder whose README names only en-it serves it-en too, since each row names the language of each
    side (pair_of reads them by name, so the columns come swapped). A DataError names the pairs there are."""
    pair = f"{lang_src}-{lang_tgt}"
    try:
        return datasets.load_dataset_builder(str(datasource), pair)
    except ValueError as error:
        if "BuilderConfig" not in str(error) and "not found" not in str(error).lower():
            raise DataError(f"cannot load {datasource!r} ({pair}): {error}") from None
        available = str(error).split("Available:")[-1].strip() if "Available:" in str(error) else "?"
    if f"'{lang_tgt}-{lang_src}'" in available:
        return datasets.load_dataset_builder(str(datasource), f"{lang_tgt}-{lang_src}")
    raise DataError(f"{datasource!r} has no {pair} language pair (available: {available})")


def pair_of(row: Any, lang_src: str, lang_tgt: str, max_bytes: int = MAX_LINE_BYTES) -> Pair | str:
    """The stripped (source, target) of a row, or why it is unusable (a side of more than `max_bytes`
    in UTF-8 among the reasons: what a Hub dataset's reader has already read, tokenizing would hold
    many times over)."""
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
    if any(len(text) > max_bytes // 4 and len(text.encode("utf-8")) > max_bytes for text in (src, tgt)):
        return TOO_LONG
    src, tgt = src.strip(), tgt.strip()
    if not src or not tgt:
        return "empty side"
    return src, tgt


def read_pairs(source: Source, split: str, lang_src: str, lang_tgt: str, label: str = "") -> Iterator[list[Pair]]:
    """The usable pairs of `split` in batches; skipped rows are counted by reason and reported as
    `label`'s (default: the split's name). A source of which more than half the rows are no text of
    pairs (UNREADABLE) is refused, once read, with one DataError line naming the counts."""
    skipped: dict[str, int] = {}
    rows = 0
    for batch in source.rows(split):
        pairs = []
        for row in batch:
            found = pair_of(row, lang_src, lang_tgt, source.max_line_bytes)
            if isinstance(found, str):
                skipped[found] = skipped.get(found, 0) + 1
            else:
                pairs.append(found)
        rows += len(batch)
        yield pairs
    detail = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))
    unreadable = sum(skipped.get(reason, 0) for reason in UNREADABLE)
    if 2 * unreadable > rows:
        raise DataError(f"{source.datasource} ({label or split}): {unreadable} of its {rows} rows are no text of "
                        f"pairs ({detail}): not a corpus this can read, so refused rather than trained on the rest")
    if skipped:
        log(f"{label or split}: skipped {sum(skipped.values())} of {rows} rows ({detail})")


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
