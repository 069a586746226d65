"""A run's tags: what else it was about, given at start (`start_run(..., tags=[...])`), kept by
a retry, found by `GET /runs?tag=` (`runs.search`). Each a word an operator types."""

from __future__ import annotations

import re
from collections.abc import Iterable

from orchestrator.runs.handle import StartRefused

MAX_TAGS = 10
MAX_TAG_CHARS = 64
# ASCII letters, digits and `-_.:/`, no spaces; the JSON Schema's form of the same.
TAG_PATTERN = r"^[A-Za-z0-9_.:/-]+$"
_TAG = re.compile(r"[A-Za-z0-9_.:/-]+")


def checked(tags: Iterable[str]) -> tuple[str, ...]:
    """Tags as a run keeps them or a filter names them: duplicates dropped in order;
    StartRefused names the first problem."""
    kept: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag) or len(tag) > MAX_TAG_CHARS:
            raise StartRefused(
                f"tag {str(tag)[:100]!r}: a tag is 1-{MAX_TAG_CHARS} letters, digits or -_.:/"
            )
        if tag not in kept:
            kept.append(tag)
    if len(kept) > MAX_TAGS:
        raise StartRefused(f"{len(kept)} tags; at most {MAX_TAGS}")
    return tuple(kept)
