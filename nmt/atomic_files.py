"""Atomic, verified file writes: used for checkpoints, tokenizers, configs and the data store.

`atomic_write(path, write)` writes through a temporary file beside `path`, fsyncs it, renames it over
`path` and fsyncs the folder, so a crash or a full disk leaves either the old file or the new one,
never a mixture. It returns the sha256 of what was written, which callers record and check on load.

`lock_file(path, busy)` is the one exclusive lock of the project (the run lock of an experiment
folder, the build lock of a data store): an flock on a small file that holds its owner's pid for
messages; the kernel drops it when its owner dies, so a stale lock file never blocks. `lock_folder`
takes the same lock on a folder itself (export.py's staging folders), where no file may be added.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Callable, TextIO


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _HashingFile(io.RawIOBase):
    """A write-only file that hashes what passes through it and remembers a failed write."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.sha256 = hashlib.sha256()
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha256.update(data)
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise


def atomic_write(path: Path, write: Callable[[io.RawIOBase], object]) -> str:
    """Call `write(file)` on a temporary file beside `path`, fsync, rename over `path`.
    Returns the sha256 of what was written. On any error the old `path` is untouched, and a write
    the disk refused is raised as that OSError even when `write` turned it into something else
    (torch.save reports a full disk as a RuntimeError about its zip position)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    hashing = None
    try:
        with open(temporary, "wb") as handle:
            hashing = _HashingFile(handle)
            write(hashing)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if hashing is not None and hashing.error is not None and not isinstance(error, OSError):
            raise hashing.error from None
        raise
    _fsync_dir(path.parent)
    return hashing.sha256.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> str:
    return atomic_write(path, lambda handle: handle.write(data))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lock_file(path: Path, busy: Callable[[str], None]) -> TextIO:
    """Take an exclusive flock on `path` (created if need be) and write this process's pid into it.
    When another process holds it, `busy(its pid, or "unknown")` is called first: it raises to give
    up, or returns to wait for the lock. Returns the open file; closing it releases the lock. Not
    POSIX (no fcntl): the file, unlocked, so that the caller runs unlocked rather than not at all."""
    handle = open(path, "a+")
    try:
        import fcntl
    except ImportError:
        return handle
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            busy(handle.read().strip() or "unknown")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    except BaseException:
        handle.close()
        raise
    return handle


def lock_folder(path: Path, wait: bool = True) -> int | None:
    """Take an exclusive flock on the folder `path` itself: its open descriptor, which releases the
    lock when closed (or when its owner dies); None when another process holds the lock and not
    `wait`. Not POSIX (no fcntl): the descriptor, unlocked. Raises OSError when `path` cannot be
    opened as a folder."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        import fcntl
    except ImportError:
        return descriptor
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor

