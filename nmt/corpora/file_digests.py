"""What a corpus file holds, by content: the sha256 of its bytes, read again only when the file may
have changed.

A run records its corpora by content (sources.Source.fingerprint), not by path, size and modification
time: `cp -p` and `rsync -t` copy a modification time onto other bytes, and an edit within the same
second can keep both. Hashing every byte at every start would cost a full read of the corpus, so each
digest is remembered in `FILE` beside the data stores with the file's place and what the kernel alone
sets: its device and inode (a file replaced by a rename or a copy gets another inode) and its change
time `st_ctime_ns` (set by every write, rename onto it or `utime`; no tool can set it to a chosen
value), besides its size and modification time. A file whose five values all match is not read; any
other is hashed again, and so is one changed in the last seconds, whose times a write within the
same clock tick would not move. A digest that cannot be remembered (a read-only store folder) is only
recomputed next time.

The same file also remembers the column order each TSV file without languages in its name was read
in, by content (`check_columns`): a run in the other direction would read its columns swapped, and is
refused instead.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from nmt.atomic_files import atomic_write_bytes, sha256_of

FILE = "file_digests.json"
RACY_NS = 3_000_000_000  # a file changed this recently may change again without its times changing


class ColumnsError(ValueError):
    """A TSV file read in another column order than an earlier run read it; the message says which."""


class FileDigests:
    """The content digests of files, remembered in `folder`/FILE (or only in this process when
    `folder` is None)."""

    def __init__(self, folder: Path | str | None = None) -> None:
        self.path = Path(folder) / FILE if folder is not None else None
        self.files: dict[str, dict] = {}
        self.columns: dict[str, list[str]] = {}
        if self.path is not None:
            known = _read_json(self.path)
            self.files, self.columns = dict(known.get("files", {})), dict(known.get("columns", {}))

    def digest(self, path: str) -> str:
        """The sha256 of `path`'s bytes: remembered while its stat values match, else read again.
        OSError when it cannot be read."""
        where = os.path.abspath(path)
        stat = os.stat(where)  # before reading: a write during the read changes it, so the next start hashes again
        guard = [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
        known = self.files.get(where)
        if isinstance(known, dict) and known.get("stat") == guard and isinstance(known.get("sha256"), str):
            return known["sha256"]
        digest = sha256_of(Path(where))
        # The kernel stamps times at a clock tick's resolution: a file written again within the tick of
        # its last stamp keeps its times. Its digest is trusted from the next start only once both times
        # lie a few seconds back (git's "racily clean" entries).
        if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > RACY_NS:
            self.files[where] = {"stat": guard, "sha256": digest}
            self._save()
        return digest

    def check_columns(self, digest: str, languages: tuple[str, str], path: str) -> None:
        """Remember that the TSV file of content `digest` (at `path`, whose name gives no languages) is
        read with its columns in `languages`; ColumnsError when an earlier run read it the other way."""
        known = self.columns.get(digest)
        if known is None:
            self.columns[digest] = list(languages)
            self._save()
        elif tuple(known) != tuple(languages):
            raise ColumnsError(f"{path}: its name gives no languages, and an earlier run read its columns as "
                               f"{known[0]}, {known[1]}; this one would read them as {languages[0]}, "
                               f"{languages[1]}, swapping source and target: name the file for its columns "
                               f"(NAME.{known[0]}-{known[1]}.tsv, if that is right), and either direction reads "
                               f"it right")

    def _save(self) -> None:
        """Merge what this process learned into FILE, atomically; another process's entries stay (a
        race loses at most an entry, which only costs a hash)."""
        if self.path is None:
            return
        known = _read_json(self.path)
        merged = {"files": {**known.get("files", {}), **self.files},
                  "columns": {**known.get("columns", {}), **self.columns}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(merged, indent=1, sort_keys=True).encode("utf-8"))
        except OSError:
            pass  # not remembered: hashed again next time


def _read_json(path: Path) -> dict:
    """The JSON object in `path`; {} when it is missing or not one (it is only a cache)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
