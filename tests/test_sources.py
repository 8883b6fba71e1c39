"""sources.py: streaming Hub-layout folders and plain parallel files, skipping and counting bad rows,
carving a train-only source; and the real tatoeba data read whole. (The on-disk store built from
these is tested in tests/test_store.py, the batches in tests/test_dataset.py.)"""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import re
from codecs import BOM_UTF8
from pathlib import Path

import numpy as np
import pytest

from nmt.corpora import sources
from config import COMPRESSION_SUFFIXES, get_config
from dataset import BilingualDataset, padding_waste, token_batches
from nmt.corpora.file_digests import FILE, FileDigests
from nmt.corpora.sources import PLAIN_SPLIT, DataError, carve, open_source, pair_of, read_all_pairs, read_pairs, text_hash
from nmt.corpora.store import text_store
from synthetic_data import synthetic_pairs, write_hub_dataset
from nmt.corpora.tokenizer import train_tokenizer

TATOEBA = Path(__file__).resolve().parents[1] / "data" / "tatoeba"  # shipped with the code


def config_for(datasource: Path, tmp_path: Path, **overrides) -> dict:
    return {**get_config(), "datasource": str(datasource), "min_frequency": 1, "store_folder": str(tmp_path / "stores"),
            **overrides}


def all_pairs(folder: Path, split: str) -> list[tuple[str, str]]:
    return [pair for batch in read_pairs(open_source(str(folder), "en", "it"), split, "en", "it") for pair in batch]


# ---------------------------------------------------------------------------- reading

def test_streams_a_local_hub_layout_folder(tmp_path: Path) -> None:
    splits = {"train": synthetic_pairs(30, 1), "validation": synthetic_pairs(5, 2), "test": synthetic_pairs(7, 3)}
    folder = write_hub_dataset(tmp_path / "data", splits)
    source = open_source(str(folder), "en", "it")
    assert source.splits == ["test", "train", "validation"]
    for name, pairs in splits.items():
        assert all_pairs(folder, name) == pairs


def test_a_hub_layout_folder_of_one_direction_serves_the_other(tmp_path: Path) -> None:
    """A README that names only en-it: it-en reads that config with the sides swapped (the
    scoring recipe's backward model), with a fingerprint of its own; a pair it lacks both ways is
    one line naming the pairs it has."""
    pairs = synthetic_pairs(6, 1)
    folder = write_hub_dataset(tmp_path / "data", {"train": pairs})
    reverse = open_source(str(folder), "it", "en")
    assert reverse.pair == "it-en" and reverse.splits == ["train"]
    assert reverse.fingerprint != open_source(str(folder), "en", "it").fingerprint
    assert read_all_pairs(reverse, "train", "it", "en") == [(tgt, src) for src, tgt in pairs]
    with pytest.raises(DataError, match=r"no fr-en language pair \(available: \['en-it'\]\)"):
        open_source(str(folder), "fr", "en")


def test_bad_rows_are_skipped_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = synthetic_pairs(4, 1)
    bad = [{"id": "a", "translation": {"en": "No Italian."}},
           {"id": "b", "translation": {"en": "Null Italian.", "it": None}},
           {"id": "c", "translation": {"en": 42, "it": "Quarantadue."}},
           {"id": "d", "translation": {"en": "", "it": "Vuoto."}},
           {"id": "e", "translation": {"en": "Blank.", "it": "   "}}]
    folder = write_hub_dataset(tmp_path / "data", {"train": good[:2] + bad + good[2:]})
    assert all_pairs(folder, "train") == good
    message = capsys.readouterr().err
    assert "train: skipped 5 of 9 rows" in message
    assert "2 missing side" in message and "1 non-text side" in message and "2 empty side" in message


def write_parquet_dataset(folder: Path, rows: list[dict], row_group_size: int = 3) -> Path:
    """An opus_books-shaped folder: one en-it parquet file with `id` and `translation` columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    (folder / "en-it").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "en-it" / "train-00000-of-00001.parquet",
                   row_group_size=row_group_size)
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: en-it\n  data_files:\n  - split: train\n"
                                      "    path: en-it/train-*.parquet\n---\n", encoding="utf-8")
    return folder


def test_local_parquet_is_read_batch_by_batch_with_bad_rows_counted(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """opus_books' layout goes through pyarrow directly, across row groups and READ_BATCH batches,
    with the same pairs and the same counts as the datasets stream of the same rows."""
    monkeypatch.setattr(sources, "READ_BATCH", 4)
    good = synthetic_pairs(9, 1)
    bad = [{"id": "a", "translation": {"en": "No Italian.", "it": None}},
           {"id": "b", "translation": {"en": "  ", "it": "Vuoto."}}]
    rows = [{"id": str(i), "translation": {"en": s, "it": t}} for i, (s, t) in enumerate(good)]
    folder = write_parquet_dataset(tmp_path / "data", rows[:4] + bad + rows[4:])
    source = open_source(str(folder), "en", "it")
    batches = list(source._local_parquet_rows([str(folder / "en-it" / "train-00000-of-00001.parquet")]))
    assert [len(batch) for batch in batches] == [3, 3, 3, 2]  # row groups of 3 (and never over READ_BATCH)
    with monkeypatch.context() as patched:
        patched.setattr(sources.Source, "_streamed_rows", lambda *_: pytest.fail("parquet went through datasets"))
        assert all_pairs(folder, "train") == good
    assert "train: skipped 2 of 11 rows (1 empty side, 1 missing side)" in capsys.readouterr().err
    assert all_pairs(write_hub_dataset(tmp_path / "json", {"train": good}), "train") == good


def test_a_damaged_parquet_file_is_one_line(tmp_path: Path) -> None:
    folder = write_parquet_dataset(tmp_path / "data", [{"id": "0", "translation": {"en": "Hi.", "it": "Ciao."}}])
    path = folder / "en-it" / "train-00000-of-00001.parquet"
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(DataError, match="^cannot read .*train-00000-of-00001.parquet: ") as raised:
        all_pairs(folder, "train")
    assert "\n" not in str(raised.value)


def test_pair_of_strips_and_checks_types() -> None:
    assert pair_of({"translation": {"en": "  Hi. ", "it": "Ciao.\n"}}, "en", "it") == ("Hi.", "Ciao.")
    assert pair_of({"translation": {"en": ["list"], "it": "x"}}, "en", "it") == "non-text side"
    assert pair_of({"translation": "just text"}, "en", "it") == "no translation field"
    assert pair_of(None, "en", "it") == "no translation field"


def test_fingerprint_is_the_content_wherever_it_lies(tmp_path: Path) -> None:
    """The datasets library once served a same-named folder's cached rows; here rows are streamed from
    the files themselves, and the fingerprint is what they hold: the same bytes in another folder
    have the same one, an edit gives another."""
    first = write_hub_dataset(tmp_path / "a" / "corpus", {"train": synthetic_pairs(6, 1)})
    second = write_hub_dataset(tmp_path / "b" / "corpus", {"train": synthetic_pairs(6, 1)})
    other = write_hub_dataset(tmp_path / "c" / "corpus", {"train": synthetic_pairs(6, 2)})
    print_a = open_source(str(first), "en", "it").fingerprint
    assert print_a == open_source(str(second), "en", "it").fingerprint
    assert print_a != open_source(str(other), "en", "it").fingerprint
    write_hub_dataset(first, {"train": synthetic_pairs(3, 5)})  # the user edits the files
    assert open_source(str(first), "en", "it").fingerprint != print_a
    assert all_pairs(first, "train") == synthetic_pairs(3, 5)


def test_unusable_sources_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        open_source(str(tmp_path / "nowhere"), "en", "it")
    folder = write_hub_dataset(tmp_path / "data", {"train": synthetic_pairs(5)})
    with pytest.raises(DataError, match="no en-fr language pair"):
        open_source(str(folder), "en", "fr")
    only_bad = write_hub_dataset(tmp_path / "bad", {"train": [{"id": "1", "translation": {"en": "", "it": ""}}]})
    with pytest.raises(DataError, match="no usable"):
        text_store(config_for(only_bad, tmp_path))


# ---------------------------------------------------------------------------- plain parallel files

def write_lines(path: Path, lines: list[str] | bytes) -> Path:
    """Lines joined by "\\n" (or raw bytes), compressed by the path's suffix as a user's tool would."""
    data = lines if isinstance(lines, bytes) else "".join(f"{line}\n" for line in lines).encode("utf-8")
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix, open)
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wb") as out:
        out.write(data)
    return path


def write_prefix(prefix: Path, pairs: list[tuple[str, str]], src_suffix: str = "", tgt_suffix: str = "") -> Path:
    write_lines(Path(f"{prefix}.en{src_suffix}"), [s for s, _ in pairs])
    write_lines(Path(f"{prefix}.it{tgt_suffix}"), [t for _, t in pairs])
    return prefix


def plain_pairs(datasource: Path | str, pair: str = "en-it", split: str = "train") -> list[tuple[str, str]]:
    return read_all_pairs(open_source(str(datasource), *pair.split("-")), split, *pair.split("-"))


def swapped(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(t, s) for s, t in pairs]


@pytest.mark.parametrize("suffixes", [("", ""), (".gz", ""), (".bz2", ".bz2"), ("", ".xz")])
def test_a_prefix_pair_reads_in_both_directions_compressed_or_not(tmp_path: Path, suffixes: tuple[str, str]) -> None:
    pairs = synthetic_pairs(12, 1)
    prefix = write_prefix(tmp_path / "corpora" / "europarl", pairs, *suffixes)
    source = open_source(str(prefix), "en", "it")
    assert source.splits == [PLAIN_SPLIT] == ["train"]
    assert plain_pairs(prefix) == pairs
    assert plain_pairs(prefix, "it-en") == swapped(pairs)


def test_a_tsv_file_is_source_then_target_unless_its_name_gives_the_pair(tmp_path: Path) -> None:
    pairs = synthetic_pairs(8, 1)
    rows = [f"{s}\t{t}" for s, t in pairs]
    assert plain_pairs(write_lines(tmp_path / "opus.tsv", rows)) == pairs
    assert plain_pairs(write_lines(tmp_path / "opus.tsv.gz", rows), "it-en") == pairs  # columns: the run's pair
    named = write_lines(tmp_path / "tm.en-it.tsv.xz", rows)
    assert plain_pairs(named, "en-it") == pairs and plain_pairs(named, "it-en") == swapped(pairs)
    with pytest.raises(DataError, match=r"tm.en-it.tsv.xz: its name gives the languages of its columns as en then it, "
                                        r"not en and fr"):
        open_source(str(named), "en", "fr")
    assert plain_pairs(tmp_path / "tm", "it-en") == swapped(pairs)  # a PREFIX finds PREFIX.SRC-TGT.tsv too


def read_with(datasource: Path, lang_src: str, lang_tgt: str) -> list[tuple[str, str]]:
    return read_all_pairs(open_source(str(datasource), lang_src, lang_tgt), "train", lang_src, lang_tgt)


def test_language_codes_with_a_hyphen_work_in_every_form_and_direction(tmp_path: Path) -> None:
    """BCP 47 codes (pt-BR, zh-Hant, sr-Latn): a PREFIX pair, a folder, a TSV file named by the pair,
    a Hub-layout folder; both directions. Before, `pair.split("-", 1)` read pt-BR-en as pt + BR-en."""
    pairs = [("Olá.", "Hello."), ("Bom dia.", "Good morning.")]
    back = swapped(pairs)
    write_lines(tmp_path / "c.pt-BR", [s for s, _ in pairs])
    write_lines(tmp_path / "c.en", [t for _, t in pairs])
    assert read_with(tmp_path / "c", "pt-BR", "en") == pairs and read_with(tmp_path / "c", "en", "pt-BR") == back
    for name in ("train.pt-BR", "train.en"):
        write_lines(tmp_path / "folder" / name, (tmp_path / name.replace("train", "c")).read_text().splitlines())
    assert read_with(tmp_path / "folder", "en", "pt-BR") == back
    tsv = write_lines(tmp_path / "t.pt-BR-en.tsv", [f"{s}\t{t}" for s, t in pairs])
    assert read_with(tsv, "pt-BR", "en") == pairs and read_with(tsv, "en", "pt-BR") == back
    hub = write_hub_dataset(tmp_path / "hub", {"train": pairs}, languages=("zh-Hant", "sr-Latn"))
    assert read_with(hub, "zh-Hant", "sr-Latn") == pairs


@pytest.mark.parametrize("name, run, read", [
    ("c.pt-BR-en.tsv", ("pt", "en"), "pt then BR-en or pt-BR then en"),  # two cuts, neither the run's pair
    ("c.de-fr.tsv", ("en", "it"), "de then fr"),
    ("c.en-GB.tsv", ("en", "it"), "en then GB")])
def test_a_tsv_name_that_reads_as_another_pair_is_refused(tmp_path: Path, name: str, run: tuple[str, str],
                                                         read: str) -> None:
    """Instead of reading it in the run's order: the name says its columns hold something else."""
    path = write_lines(tmp_path / name, ["a\tb"])
    with pytest.raises(DataError, match=f"its name gives the languages of its columns as {read}, not"):
        open_source(str(path), *run)
    for plain in ("c.tsv", "c.v2-final.tsv", "my-corpus.tsv", "c.2024-01.tsv"):  # names that give no pair
        assert read_with(write_lines(tmp_path / plain, ["a\tb"]), *run) == [("a", "b")]


def test_a_folder_of_split_files_keeps_its_own_held_out_splits(tmp_path: Path) -> None:
    train, valid, test = synthetic_pairs(20, 1), synthetic_pairs(5, 2), synthetic_pairs(6, 3)
    folder = tmp_path / "corpus"
    write_prefix(folder / "train", train, ".gz", ".gz")
    write_prefix(folder / "valid", valid)
    write_lines(folder / "test.tsv.bz2", [f"{s}\t{t}" for s, t in test])
    assert open_source(str(folder), "en", "it").splits == ["test", "train", "validation"]
    assert [plain_pairs(folder, "en-it", split) for split in ("train", "validation", "test")] == [train, valid, test]
    assert plain_pairs(folder, "it-en", "validation") == swapped(valid)
    for name in ("valid.en", "valid.it"):
        (folder / name).rename(folder / name.replace("valid", "dev"))
    assert plain_pairs(folder, "en-it", "validation") == valid
    write_prefix(folder / "validation", valid)
    with pytest.raises(DataError, match="holds validation.* and dev.*: both would be the validation split"):
        open_source(str(folder), "en", "it")


def test_the_store_reads_plain_files_and_carves_a_train_only_prefix(tmp_path: Path) -> None:
    pairs = synthetic_pairs(200, 1)
    prefix = write_prefix(tmp_path / "europarl", pairs, ".gz", ".gz")
    store = text_store(config_for(prefix, tmp_path))
    assert store.splits() == ["train", "validation", "test"]
    assert set(store.pairs("train") + store.pairs("validation") + store.pairs("test")) <= set(pairs)
    assert store.size("validation") == store.size("test") == 10


@pytest.mark.parametrize("longer", ["en", "it"])
def test_files_of_different_lengths_end_the_build_in_one_line(tmp_path: Path, longer: str) -> None:
    pairs = synthetic_pairs(40, 1)
    prefix = write_prefix(tmp_path / "europarl", pairs, ".gz", "")
    extra = {"en": ".gz", "it": ""}[longer]
    write_lines(Path(f"{prefix}.{longer}{extra}"), [pair[longer == "it"] for pair in pairs] + ["One more.", "Two."])
    counts = {"en": 40, "it": 40, longer: 42}
    config = config_for(prefix, tmp_path)
    with pytest.raises(DataError) as raised:
        text_store(config)
    assert str(raised.value).startswith(f"{prefix}.en.gz has {counts['en']} lines but {prefix}.it has {counts['it']}")
    assert "\n" not in str(raised.value)
    assert [p.suffix for p in Path(config["store_folder"]).iterdir() if p.name != FILE] == [".lock"], \
        "no store of a bad pair"


def test_bad_lines_are_skipped_and_counted_by_reason(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = synthetic_pairs(3, 1)
    write_lines(tmp_path / "c.en", [good[0][0], "", good[1][0], "   ", "No Italian.", good[2][0]])
    write_lines(tmp_path / "c.it", [good[0][1], "Vuoto.", good[1][1], "Spazi.", "", good[2][1]])
    assert plain_pairs(tmp_path / "c") == good
    assert "train: skipped 3 of 6 rows (3 empty side)" in capsys.readouterr().err
    tsv = [f"{good[0][0]}\t{good[0][1]}", "Three\tcolumns\there", "One column", "", f"\t{good[1][1]}",
           f"{good[2][0]}\t{good[2][1]}"]
    write_lines(tmp_path / "t.tsv", tsv)
    assert plain_pairs(tmp_path / "t.tsv") == [good[0], good[2]]
    assert "train: skipped 4 of 6 rows (2 empty side, 2 not two TSV columns)" in capsys.readouterr().err


def test_a_bom_and_windows_line_endings_are_stripped_and_only_newline_ends_a_line(tmp_path: Path) -> None:
    """U+2028, U+0085 and a form feed end a line for str.splitlines, not for a parallel corpus."""
    sources = ["Hello.", "The cat\u2028sleeps.", "Page\x0cbreak\u0085here."]
    targets = ["Ciao.", "Il gatto dorme.", "Interruzione."]
    write_lines(tmp_path / "c.en.gz", "\ufeff".encode() + "\r\n".join(sources).encode() + b"\r\n")
    write_lines(tmp_path / "c.it", "\ufeff".encode() + "\n".join(targets).encode())  # no final newline
    assert plain_pairs(tmp_path / "c") == list(zip(sources, targets))
    write_lines(tmp_path / "t.tsv", "\ufeff".encode() + b"Hi.\tCiao.\r\n")
    assert plain_pairs(tmp_path / "t.tsv") == [("Hi.", "Ciao.")]


def test_missing_and_ambiguous_files_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_lines(tmp_path / "half.en", ["Hello."])
    half = re.escape(str(tmp_path / "half"))
    with pytest.raises(DataError, match=rf"^found {half}.en but not {half}.it \(tried {half}.it, {half}.it.gz, "
                                        rf"{half}.it.bz2, {half}.it.xz\)$"):
        open_source(str(tmp_path / "half"), "en", "it")
    with pytest.raises(DataError, match=r"is one side of a parallel pair: name its PREFIX, --datasource .*/half$"):
        open_source(str(tmp_path / "half.en"), "en", "it")
    write_prefix(tmp_path / "twice", synthetic_pairs(2))
    write_lines(tmp_path / "twice.en.gz", ["Hello."])
    twice = re.escape(str(tmp_path / "twice"))
    with pytest.raises(DataError, match=rf"^both {twice}.en and {twice}.en.gz exist"):
        open_source(str(tmp_path / "twice"), "en", "it")
    (tmp_path / "corpora").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: pytest.fail("a local path went to the Hub"))
    with pytest.raises(DataError, match=r"^datasource 'corpora/europarl' does not exist: tried the folder "
                                        r"corpora/europarl, corpora/europarl.tsv and corpora/europarl.en \+ "
                                        r"corpora/europarl.it \(each also .gz, .bz2, .xz\)$"):
        open_source("corpora/europarl", "en", "it")
    with pytest.raises(DataError, match=r"^datasource 'opus.tsv.gz' does not exist: no file opus.tsv.gz$"):
        open_source("opus.tsv.gz", "en", "it")
    with pytest.raises(DataError, match=r"^notes.txt is a file but not a TSV file"):
        open_source(write_lines(Path("notes.txt"), ["Hello."]).name, "en", "it")


@pytest.mark.parametrize("link", ["loop", "dangling"])
def test_a_symbolic_link_that_leads_nowhere_is_named_as_such(tmp_path: Path, link: str) -> None:
    """Not "does not exist": os.path.exists is False for both, and the user sees the link in ls."""
    if link == "loop":
        os.symlink(tmp_path / "b.en", tmp_path / "a.en")
        os.symlink(tmp_path / "a.en", tmp_path / "b.en")
        expected = "a.en is a symbolic link loop"
    else:
        os.symlink(tmp_path / "gone.en", tmp_path / "a.en")
        expected = f"a.en is a symbolic link to {tmp_path / 'gone.en'}, which does not exist"
    write_lines(tmp_path / "a.it", ["Ciao."])
    for datasource in (tmp_path / "a", tmp_path / "a.en"):
        with pytest.raises(DataError, match=re.escape(expected)):
            open_source(str(datasource), "en", "it")


def test_a_line_past_max_line_bytes_is_skipped_in_bounded_memory_and_time(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """The issue's 54 MB line held 7 GB while training; here a 24 MB one is counted and skipped, read
    past in pieces of max_line_bytes: the reading's Python allocations stay under 1 MB."""
    import time
    import tracemalloc
    pairs = synthetic_pairs(3, 1)
    write_lines(tmp_path / "c.en", [pairs[0][0], "x" * 24_000_000, pairs[2][0]])
    write_lines(tmp_path / "c.it", [pairs[0][1], "Lungo.", pairs[2][1]])
    source = open_source(str(tmp_path / "c"), "en", "it", max_line_bytes=1024)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        read = [pair for batch in read_pairs(source, "train", "en", "it") for pair in batch]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 5
    assert read == [pairs[0], pairs[2]] and peak < 1 << 20, peak
    assert "train: skipped 1 of 3 rows (1 longer than max_line_bytes)" in capsys.readouterr().err
    assert pair_of({"translation": {"en": "y" * 2000, "it": "Ciao."}}, "en", "it", 1024) == "longer than max_line_bytes"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-16-le"])
def test_utf_16_and_nul_bytes_are_refused_in_one_line(tmp_path: Path, encoding: str) -> None:
    """UTF-16 was trained on as garbage: a third of its lines invalid UTF-8, the rest NUL-interleaved."""
    text = "".join(f"Sentence number {i}.\tFrase numero {i}.\n" for i in range(50))
    path = tmp_path / "c.tsv"
    path.write_bytes(text.encode(encoding))
    why = "is UTF-16 (it starts with a UTF-16 byte-order mark)" if encoding == "utf-16" else "holds a NUL byte on line 1"
    with pytest.raises(DataError, match=re.escape(f"{path} {why}")):
        read_all_pairs(open_source(str(path), "en", "it"), "train", "en", "it")


def test_a_tsv_file_most_of_whose_lines_are_no_pairs_is_refused(tmp_path: Path) -> None:
    """A comma-separated file named .tsv: not trained on the lines that happen to hold a tab."""
    rows = [f"Why {i}?,Perché {i}?" for i in range(6)] + [f"Ok {i}.\tOk {i}." for i in range(5)]
    path = write_lines(tmp_path / "c.tsv", rows)
    with pytest.raises(DataError, match=r"\(train\): 6 of its 11 rows are no text of pairs \(6 not two TSV columns\)"):
        read_all_pairs(open_source(str(path), "en", "it"), "train", "en", "it")


# Each form of plain files, as one reader reads it: (files written, the datasource, the file its bad line is in).
PLAIN_FORMS = {"parallel files": (("c.en", "c.it"), "c", "c.it"), "TSV": (("c.tsv",), "c.tsv", "c.tsv"),
               "gzip TSV": (("c.tsv.gz",), "c.tsv.gz", "c.tsv.gz"),
               "bzip2 parallel files": (("c.en.bz2", "c.it.bz2"), "c", "c.en.bz2"),
               "xz parallel files": (("c.en", "c.it.xz"), "c", "c.it.xz")}


def write_form(folder: Path, form: str, pairs: list[tuple[str, str]], bad_line: int | None = None) -> str:
    """`pairs` written in `form` (PLAIN_FORMS), each file starting with a UTF-8 BOM as Windows editors
    save it; with `bad_line`, that line of the form's bad file is Windows-1252 (an è), not UTF-8."""
    files, datasource, bad_file = PLAIN_FORMS[form]
    for name in files:
        side = name.startswith("c.it")
        lines = [f"{s}\t{t}" for s, t in pairs] if len(files) == 1 else [pair[side] for pair in pairs]
        data = [line.encode("utf-8") for line in lines]
        if name == bad_file and bad_line:
            data[bad_line - 1] = data[bad_line - 1].replace(b".", "è.".encode("cp1252"), 1)
        write_lines(folder / name, "\ufeff".encode() + b"\n".join(data) + b"\n")
    return str(folder / datasource)


@pytest.mark.parametrize("form", PLAIN_FORMS)
def test_plain_files_are_utf_8_with_or_without_a_bom_and_a_line_that_is_not_refuses_the_file(tmp_path: Path,
                                                                                              form: str) -> None:
    """The BOM is no part of the first sentence; a line of another encoding refuses its file in one
    line naming it and the line, instead of training on the rest (the accented lines would be lost)."""
    pairs = synthetic_pairs(4, 1)
    assert plain_pairs(write_form(tmp_path / "good", form, pairs)) == pairs
    datasource = write_form(tmp_path / "bad", form, pairs, bad_line=3)
    bad_file = tmp_path / "bad" / PLAIN_FORMS[form][2]
    with pytest.raises(DataError, match=rf"^{re.escape(str(bad_file))}: line 3 is not UTF-8 \(byte 0xE8 at byte \d+ "
                                        rf"of the line\): save the file as UTF-8, .*iconv -f CP1252 -t UTF-8[^\n]*$"):
        plain_pairs(datasource)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_hub_folder_files_are_utf_8_with_or_without_a_bom_and_a_line_that_is_not_is_named(tmp_path: Path,
                                                                                          suffix: str) -> None:
    pairs = synthetic_pairs(4, 1)
    folder = write_hub_dataset(tmp_path / "data", {"train": pairs})
    path = folder / "en-it" / "train.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)

    def write(rows: list[bytes]) -> Path:
        written = write_lines(Path(f"{path}{suffix}"), b"".join([BOM_UTF8 + rows[0], *rows[1:]]))
        readme = folder / "README.md"
        readme.write_text(readme.read_text("utf-8").replace("train.jsonl\n", f"train.jsonl{suffix}\n"), "utf-8")
        if suffix:
            path.unlink(missing_ok=True)
        return written

    write(lines)
    assert plain_pairs(folder) == pairs
    written = write([*lines[:2], lines[2].replace(b".", "è.".encode("cp1252"), 1), lines[3]])
    with pytest.raises(DataError, match=rf"^cannot read '{re.escape(str(folder))}' \(en-it\) train: "
                                        rf"{re.escape(str(written))}: line 3 is not UTF-8 \(byte 0xE8 at byte \d+ "):
        plain_pairs(folder)


def test_a_held_out_file_with_a_bom_keeps_its_first_sentence_whole(tmp_path: Path) -> None:
    corpus = write_prefix(tmp_path / "corpus", synthetic_pairs(40, 1))
    dev = write_form(tmp_path / "dev", "TSV", synthetic_pairs(3, 2))
    store = text_store(config_for(corpus, tmp_path, valid_data=dev))
    assert store.pairs("validation") == synthetic_pairs(3, 2)


def test_every_compression_a_corpus_name_drops_is_read() -> None:
    assert set(sources.OPENERS) == set(COMPRESSION_SUFFIXES)


def test_local_files_win_over_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = synthetic_pairs(5, 1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=5.0: pytest.fail("local files went to the Hub"))
    write_prefix(tmp_path / "Helsinki-NLP" / "opus_books", pairs)
    assert plain_pairs("Helsinki-NLP/opus_books") == pairs
    write_lines(tmp_path / "opus100.tsv", [f"{s}\t{t}" for s, t in pairs])
    assert plain_pairs("opus100.tsv") == pairs
    write_prefix(tmp_path / "wmt14" / "train", pairs)
    assert plain_pairs("wmt14") == pairs


@pytest.mark.parametrize("damage", ["truncated gz", "corrupt gz", "truncated xz", "not gzip"])
def test_a_damaged_compressed_file_is_one_line_even_halfway(tmp_path: Path, damage: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "READ_BATCH", 50)
    pairs = synthetic_pairs(3000, 1)
    suffix = ".xz" if "xz" in damage else ".gz"
    prefix = write_prefix(tmp_path / "c", pairs, suffix, "")
    path = Path(f"{prefix}.en{suffix}")
    data = path.read_bytes()
    if damage.startswith("truncated"):
        path.write_bytes(data[:len(data) // 2])
    elif damage == "corrupt gz":
        path.write_bytes(data[:len(data) // 2] + bytes(b ^ 0x55 for b in data[len(data) // 2:]))
    else:
        write_lines(path.with_suffix(""), [s for s, _ in pairs]).rename(path)
    batches = read_pairs(open_source(str(prefix), "en", "it"), "train", "en", "it")
    if damage != "not gzip":
        assert len(next(batches)) == 50  # the damage is met halfway through the stream
    with pytest.raises(DataError, match=rf"^cannot read {re.escape(str(path))}: ") as raised:
        list(batches)
    assert "\n" not in str(raised.value)


def test_a_plain_corpus_edited_on_disk_gets_a_new_fingerprint(tmp_path: Path) -> None:
    """Even to the same size and modification time (cp -p, rsync -t): the remembered digest is
    trusted only while the file's inode and change time, which no tool sets, are those it was read
    with; a file left alone is not read again."""
    digests = FileDigests(tmp_path / "stores")
    prefix = write_prefix(tmp_path / "a" / "c", synthetic_pairs(6, 1), ".gz")
    first = open_source(str(prefix), "en", "it", digests=digests).fingerprint
    assert open_source(f"{tmp_path}/a/../a/c", "en", "it", digests=FileDigests(tmp_path / "stores")).fingerprint == first
    assert open_source(str(write_prefix(tmp_path / "b" / "c", synthetic_pairs(6, 2), ".gz")), "en", "it").fingerprint \
        != first
    path = Path(f"{prefix}.it")
    stat = path.stat()
    text = path.read_text("utf-8")
    path.write_text(text.swapcase(), "utf-8")  # same size, and the same mtime after utime, as cp -p leaves it
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert open_source(str(prefix), "en", "it", digests=FileDigests(tmp_path / "stores")).fingerprint != first


def test_train_py_trains_on_a_gzipped_prefix_and_reuses_its_store(tmp_path: Path, cli,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """From the command line, as a user with train.en.gz + train.it.gz would; the second run (in this
    process, to keep the suite fast) resumes and builds nothing."""
    import train
    prefix = write_prefix(tmp_path / "corpora" / "train", synthetic_pairs(300, 1), ".gz", ".gz")
    args = ["--datasource", str(prefix), "--preset", "tiny", "--max_steps", "2", "--val_max_sentences", "4",
            "--num_examples", "0", "--model_folder", str(tmp_path / "w"), "--runs_folder", str(tmp_path / "r"),
            "--store_folder", str(tmp_path / "s")]
    first = cli("train.py", *args)
    assert first.returncode == 0, first.stderr
    assert "building the data store" in first.stderr and "steps per epoch" in first.stderr
    assert (tmp_path / "w" / "train_en-it" / "ckpt_00000002.pt").is_file()
    def stores_built() -> dict[str, int]:  # the digests' own file may change: a corpus just written is hashed again
        return {p.name: p.stat().st_mtime_ns for p in (tmp_path / "s").iterdir() if p.name != FILE}

    stores = stores_built()
    assert train.main(args + ["--max_steps", "3"]) == 0
    second = capsys.readouterr().err
    assert "building the data store" not in second and "tokenizing" not in second and "data store" in second
    assert (tmp_path / "w" / "train_en-it" / "ckpt_00000003.pt").is_file()
    assert stores_built() == stores and stores


# ---------------------------------------------------------------------------- carving

def test_carving_is_seeded_capped_and_a_partition() -> None:
    hashes = np.arange(1000, dtype=np.uint64) * 7919  # all sources distinct
    config = {**get_config(), "seed": 1}
    first = carve(hashes, config, ["validation", "test"])
    assert {name: len(rows) for name, rows in first.items()} == {"train": 900, "validation": 50, "test": 50}
    assert sorted(np.concatenate(list(first.values())).tolist()) == list(range(1000))
    again = carve(hashes, config, ["validation", "test"])
    assert all(np.array_equal(first[k], again[k]) for k in first)
    other = carve(hashes, {**config, "seed": 2}, ["validation", "test"])
    assert not np.array_equal(first["validation"], other["validation"])
    capped = carve(hashes, {**config, "val_max_pairs": 20, "test_max_pairs": 30}, ["validation", "test"])
    assert (len(capped["validation"]), len(capped["test"]), len(capped["train"])) == (20, 30, 950)
    only_test = carve(hashes, config, ["test"])
    assert set(only_test) == {"train", "test"} and len(only_test["test"]) == 50


def test_training_pairs_whose_source_is_held_out_are_removed(capsys: pytest.CaptureFixture) -> None:
    # 300 pairs, 100 distinct source sentences, each three times: a held-out sentence's twins leave train.
    hashes = np.array([text_hash(f"sentence {i % 100}") for i in range(300)], dtype=np.uint64)
    config = {**get_config(), "seed": 3, "val_fraction": 0.1, "test_fraction": 0.1}
    parts = carve(hashes, config, ["validation", "test"])
    held_out = set(hashes[np.concatenate([parts["validation"], parts["test"]])].tolist())
    assert len(parts["validation"]) == len(parts["test"]) == 30
    assert not held_out & set(hashes[parts["train"]].tolist())
    removed = 240 - len(parts["train"])
    assert removed > 0 and f"removed {removed} training pairs whose source sentence is also in the held-out" in \
        capsys.readouterr().err


# ---------------------------------------------------------------------------- real data

def test_tatoeba_loads_whole_and_deterministically(tmp_path: Path) -> None:
    folder = TATOEBA
    usable = {}
    for split, size in (("train", 15359), ("validation", 679), ("test", 1282)):
        rows = [json.loads(line) for line in (folder / "en-it" / f"{split}.jsonl").read_text("utf-8").splitlines()]
        assert len(rows) == size
        usable[split] = sum(isinstance(r["translation"].get("en"), str) and isinstance(r["translation"].get("it"), str)
                            and bool(r["translation"]["en"].strip()) and bool(r["translation"]["it"].strip())
                            for r in rows)
    config = config_for(folder, tmp_path, min_frequency=2, clean=False)  # reading, not cleaning (test_cleaning.py)
    store = text_store(config)
    assert {name: store.size(name) for name in store.splits()} == usable
    train = store.pairs("train")
    assert train == all_pairs(folder, "train")
    # the real lengths, batched as the cpu preset does, waste little on padding
    tok_src = train_tokenizer([s for s, _ in train], "wordlevel", 10_000, 2)
    tok_tgt = train_tokenizer([t for _, t in train], "wordlevel", 10_000, 2)
    dataset = BilingualDataset.from_pairs(train, tok_src, tok_tgt, seq_len=128)
    for budget in (512, 3000, 4096):
        batches = token_batches(dataset.src_lens, dataset.tgt_lens, budget, np.random.default_rng(0))
        assert padding_waste(batches, dataset.src_lens, dataset.tgt_lens) < 0.10
