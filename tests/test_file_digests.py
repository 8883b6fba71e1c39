"""file_digests.py: a file's content digest is read again exactly when its stat values (inode and
change time included) say it may have changed, or it changed too recently to tell; and a TSV file
without languages in its name keeps the column order it was first read in."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from nmt.corpora import file_digests
from nmt.corpora.file_digests import FILE, ColumnsError, FileDigests


@pytest.fixture
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files hashed, in order (the remembered digests are trusted at once: no file is too recent)."""
    reads: list[Path] = []
    real = file_digests.sha256_of

    def counting(path: Path) -> str:
        reads.append(Path(path))
        return real(path)

    monkeypatch.setattr(file_digests, "sha256_of", counting)
    monkeypatch.setattr(file_digests, "RACY_NS", -10**18)
    return reads


def test_a_file_left_alone_is_read_once_across_processes(tmp_path: Path, counted_reads: list[Path]) -> None:
    corpus = tmp_path / "corpus.en"
    corpus.write_bytes(b"Hello.\n")
    assert FileDigests(tmp_path / "stores").digest(str(corpus)) == hashlib.sha256(b"Hello.\n").hexdigest()
    assert FileDigests(tmp_path / "stores").digest(str(corpus)) == hashlib.sha256(b"Hello.\n").hexdigest()
    assert counted_reads == [corpus]
    assert (tmp_path / "stores" / FILE).is_file()


def test_cp_p_over_it_or_an_edit_with_its_times_restored_is_read_again(tmp_path: Path,
                                                                       counted_reads: list[Path]) -> None:
    """What size and modification time alone miss: a copy with -p (another inode), and bytes rewritten
    in place with the old mtime put back (another change time, which no tool can set)."""
    corpus, other = tmp_path / "corpus.en", tmp_path / "other.en"
    corpus.write_bytes(b"Hello.\n")
    other.write_bytes(b"Hallo.\n")
    stat = corpus.stat()
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    digests = FileDigests(tmp_path / "stores")
    first = digests.digest(str(corpus))
    shutil.copy2(other, corpus)  # cp -p: same size, same mtime
    assert (corpus.stat().st_size, corpus.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    second = FileDigests(tmp_path / "stores").digest(str(corpus))
    assert second == hashlib.sha256(b"Hallo.\n").hexdigest() != first
    with open(corpus, "r+b") as handle:  # in place: the same inode
        handle.write(b"J")
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert FileDigests(tmp_path / "stores").digest(str(corpus)) == hashlib.sha256(b"Jallo.\n").hexdigest()
    assert counted_reads == [corpus] * 3


def test_a_file_changed_in_the_last_seconds_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written again within the same clock tick, a file keeps all its times: its digest is remembered
    only once they lie RACY_NS back."""
    corpus = tmp_path / "corpus.en"
    corpus.write_bytes(b"Hello.\n")
    FileDigests(tmp_path / "stores").digest(str(corpus))
    assert not (tmp_path / "stores" / FILE).exists()
    monkeypatch.setattr(file_digests, "RACY_NS", -10**18)
    FileDigests(tmp_path / "stores").digest(str(corpus))
    assert (tmp_path / "stores" / FILE).exists()


def test_an_unwritable_or_damaged_record_only_costs_a_read(tmp_path: Path, counted_reads: list[Path]) -> None:
    corpus = tmp_path / "corpus.en"
    corpus.write_bytes(b"Hello.\n")
    (tmp_path / "file").write_text("not a folder")
    assert FileDigests(tmp_path / "file" / "stores").digest(str(corpus))  # cannot be written: still a digest
    (tmp_path / "stores").mkdir()
    (tmp_path / "stores" / FILE).write_text("{not json")
    assert FileDigests(tmp_path / "stores").digest(str(corpus)) == hashlib.sha256(b"Hello.\n").hexdigest()


def test_an_unnamed_tsv_keeps_the_column_order_it_was_first_read_in(tmp_path: Path) -> None:
    FileDigests(tmp_path).check_columns("abc", ("en", "it"), "corpus.tsv")
    FileDigests(tmp_path).check_columns("abc", ("en", "it"), "copy/corpus.tsv")
    FileDigests(tmp_path).check_columns("def", ("it", "en"), "other.tsv")
    with pytest.raises(ColumnsError, match=r"corpus.tsv: its name gives no languages, and an earlier run read its "
                                           r"columns as en, it; this one would read them as it, en.*NAME.en-it.tsv"):
        FileDigests(tmp_path).check_columns("abc", ("it", "en"), "corpus.tsv")
