"""What text from outside a request may be, checked where it enters.

- `unstorable`, `first_unstorable`: text Postgres cannot store. Text and JSONB refuse NUL,
  and a lone surrogate (a JSON `\\u` escape can produce one) has no UTF-8 encoding.
- `is_run_id`: the form of a run id; anything else names no run.
- `is_ascii_digits`: a decimal number in ASCII. `str.isdigit` also passes superscripts and
  other digits that `int()` refuses (`"²"`), so a parameter checked with it alone fails later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Crockford base32, as python-ulid prints it.
_RUN_ID = re.compile(r"run_[0-9A-HJKMNP-TV-Z]{26}")


def is_run_id(value: str) -> bool:
    return _RUN_ID.fullmatch(value) is not None


def is_ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def unstorable(text: str) -> str | None:
    """Why Postgres cannot store `text`, or None when it can: text and JSONB refuse NUL, and
    a lone surrogate (a JSON escape can produce one) has no UTF-8 encoding."""
    if "\x00" in text:
        return "must not contain NUL (U+0000)"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "must not contain a lone surrogate (U+D800-U+DFFF)"
    return None


def first_unstorable(document: object) -> tuple[list[str | int], str] | None:
    """Where in a JSON-like document an unstorable string (value or key) is, and why."""
    # A loop, not recursion: a document as deep as the JSON parser allows must not overflow.
    pending: list[tuple[list[str | int], object]] = [([], document)]
    while pending:
        loc, value = pending.pop()
        if isinstance(value, str):
            if reason := unstorable(value):
                return loc, reason
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if isinstance(key, str) and (reason := unstorable(key)):
                    return [*loc, key], f"key {reason}"
                pending.append(([*loc, key], item))
        elif isinstance(value, list | tuple):
            pending.extend(([*loc, index], item) for index, item in enumerate(value))
    return None
