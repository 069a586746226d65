"""Keyset pagination over runs, newest first, by (created_at, id).

A page ends where the next one starts, by value rather than by offset: runs inserted while a
client pages do not shift or repeat rows, and a deep page costs the same index range scan as
the first. Ties on `created_at` are broken by the run id, so the order is total.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from orchestrator.models import TaskHistory
from orchestrator.text import is_run_id


def encode_cursor(values: list[object]) -> str:
    """An opaque cursor: the JSON of `values`, URL-safe base64 without its padding."""
    raw = json.dumps(values, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Any:
    """What `encode_cursor` was given, or ValueError: a cursor comes back from the client, so
    bad base64, bad UTF-8 and JSON nested deeper than the parser can follow are refused, not
    raised. The caller checks the values themselves."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return json.loads(base64.urlsafe_b64decode(padded))
    except (binascii.Error, UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("not a cursor from a previous page") from None


@dataclass(frozen=True)
class Position:
    """The last run of a page: the next page starts strictly after it."""

    created_at: datetime
    run_id: str

    def encode(self) -> str:
        return encode_cursor([self.created_at.isoformat(), self.run_id])

    @classmethod
    def decode(cls, cursor: str) -> Position:
        """The position a cursor names, or ValueError when it names none.

        A cursor comes back from the client, so it is checked as any input: an aware time, a
        run id of the one format (so no text the database would refuse), and JSON nested
        deeper than the parser can follow refused rather than raised.
        """
        try:
            created_at, run_id = decode_cursor(cursor)
            position = cls(datetime.fromisoformat(created_at), run_id)
        except (TypeError, ValueError):
            raise ValueError("not a cursor from a previous page") from None
        if position.created_at.tzinfo is None or not (
            isinstance(run_id, str) and is_run_id(run_id)
        ):
            raise ValueError("not a cursor from a previous page")
        return position


def page(
    runs: QuerySet[TaskHistory], after: Position | None, limit: int
) -> tuple[list[TaskHistory], Position | None]:
    """Up to `limit` runs after `after`, and where the next page starts (None on the last)."""
    ordered = runs.order_by("-created_at", "-id")
    if after is not None:
        ordered = ordered.filter(
            Q(created_at__lt=after.created_at) | Q(created_at=after.created_at, id__lt=after.run_id)
        )
    # One extra row says whether another page exists without a COUNT.
    rows = list(ordered[: limit + 1])
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], Position(last.created_at, last.id)
