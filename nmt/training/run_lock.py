"""The run lock: one training process per experiment folder.

`RunLock` holds `train.lock` in the folder through atomic_files.lock_file (flock): the kernel drops
the lock when its owner dies, so a stale lock file never blocks, and the file holds the owner's PID
for the message that refuses a second run.
"""
from __future__ import annotations

from pathlib import Path

from nmt.atomic_files import lock_file


class RunLockError(RuntimeError):
    """An experiment folder in use by another run, or one that cannot be locked; the message says which."""


class RunLock:
    """An exclusive lock on an experiment folder, holding the owner's PID for the message."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / "train.lock"
        self.handle = None

    def acquire(self) -> None:
        def refuse(owner: str) -> None:
            raise RunLockError(f"{self.path.parent} is in use by another training run (pid {owner}); "
                               f"wait for it or choose another --experiment_name")

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = lock_file(self.path, refuse)
        except OSError as error:
            raise RunLockError(f"cannot lock {self.path}: {error.strerror or error}") from None

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
