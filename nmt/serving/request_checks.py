"""A refused request (`ApiError`: its status and the one line the client is shown) and the checks
of a request's values that both of serve.py's APIs use (its own and LibreTranslate's)."""
from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A refused request: the HTTP status, the one line the client is shown, and any headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def json_type(value: Any) -> str:
    """How a JSON value is called in an error message."""
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def check_sentence(text: Any, name: str, max_chars: int) -> str:
    """The sentence stripped, or an ApiError naming it (`name`) and what is wrong with it."""
    return check_text(text, name, max_chars).strip()


def check_text(text: Any, name: str, max_chars: int) -> str:
    """The text as it is, or an ApiError naming it (`name`) and what is wrong with it."""
    if not isinstance(text, str):
        raise ApiError(400, f"{name} must be a string, got {json_type(text)}")
    if not text.strip():
        raise ApiError(400, f"{name} is empty")
    if len(text) > max_chars:
        raise ApiError(400, f"{name} is {len(text)} characters long; the limit is {max_chars} (serve_max_chars)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, sent as a \ud800 escape
        raise ApiError(400, f"{name} is not valid Unicode (a lone surrogate)") from None
    return text
