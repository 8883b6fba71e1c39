"""text_files.py: UTF-8 with or without a byte-order mark is read as its text; anything else is one
line naming the file and the byte (counted with the mark), and UTF-16 is called by its name."""
from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from nmt.text_files import TextFileError, decode_text, read_text


def test_utf8_with_or_without_a_byte_order_mark(tmp_path: Path) -> None:
    (tmp_path / "plain.txt").write_bytes("caffè\n".encode("utf-8"))
    (tmp_path / "marked.txt").write_bytes(codecs.BOM_UTF8 + "caffè\n".encode("utf-8"))
    assert read_text(tmp_path / "plain.txt") == read_text(tmp_path / "marked.txt") == "caffè\n"
    assert decode_text(codecs.BOM_UTF8 + codecs.BOM_UTF8, "x") == "\ufeff"  # only the first mark is the file's


@pytest.mark.parametrize("data, message", [
    (b"caf\xe9\n", r"^notes.txt is not UTF-8 text \(byte 3\)$"),
    (codecs.BOM_UTF8 + b"caf\xe9\n", r"^notes.txt is not UTF-8 text \(byte 6\)$"),
    ("caffè".encode("utf-16"), r"^notes.txt is not UTF-8 text \(byte 0\): it is UTF-16, save it as UTF-8$"),
])
def test_other_bytes_are_one_line_naming_the_byte(data: bytes, message: str) -> None:
    with pytest.raises(TextFileError, match=message):
        decode_text(data, "notes.txt")


def test_a_file_that_cannot_be_read_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TextFileError, match=r"^terms.tsv: cannot read it: No such file or directory$"):
        read_text(tmp_path / "missing.txt", "terms.tsv")
    with pytest.raises(TextFileError, match=f"^{tmp_path}: cannot read it: Is a directory$"):
        read_text(tmp_path)
