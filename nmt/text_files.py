"""Text files as people save them: UTF-8, with or without the byte-order mark that Excel and Windows
editors write first (U+FEFF, which would otherwise stick to the first word: "\\ufeffcat").

`read_text` is how a reader of a user's file (a glossary, a config file) gets its text; a file that
cannot be read is one `TextFileError` naming it, and so is one that is not UTF-8, naming the byte,
and saying so where it is UTF-16, which Windows calls "Unicode".
"""
from __future__ import annotations

import codecs
from pathlib import Path


class TextFileError(ValueError):
    """A file that cannot be read, or is not UTF-8 text; the message is one line that names the file
    (and the byte)."""


def decode_text(data: bytes, name: str) -> str:
    """`data` as UTF-8 text without its byte-order mark, if it has one; TextFileError otherwise,
    `name` naming the file and the offset counting the mark."""
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as error:
        utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        hint = ": it is UTF-16, save it as UTF-8" if utf16 else ""
        raise TextFileError(f"{name} is not UTF-8 text (byte {start + error.start}){hint}") from None


def read_text(path: Path, name: str = "") -> str:
    """The text of the file at `path` (decode_text); `name` is how the message calls it (by default
    its path): "NAME: cannot read it: No such file or directory"."""
    name = name or str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TextFileError(f"{name}: cannot read it: {error.strerror or error}") from None
    return decode_text(data, name)
