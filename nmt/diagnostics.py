"""Diagnostics on stderr, one line each: what every module reports while it works (`log`) and how an
error of a library becomes one line of ours (`first_line`)."""
from __future__ import annotations

import sys


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def first_line(error: BaseException) -> str:
    """An error's message in one line (its type's name when it has none)."""
    return (str(error).splitlines() or [type(error).__name__])[0]
