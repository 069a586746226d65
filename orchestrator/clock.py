"""Time as a dependency, so time-driven logic is testable without sleeping, and the few
conversions every store and page shares (spans in ms, a span as people read it). Moments as
Valkey holds them (milliseconds since the epoch) are `stores.valkey`'s."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    # The standard library's own call, bound: reading the time runs no Python of ours.
    now = staticmethod(partial(datetime.now, UTC))


class FrozenClock:
    """A clock that moves only when told to."""

    def __init__(self, at: datetime) -> None:
        self._at = at

    def now(self) -> datetime:
        return self._at

    def advance(self, by: timedelta) -> None:
        self._at += by


def span_ms(span: timedelta) -> int:
    """A span in whole milliseconds (PX, PEXPIRE and script arguments)."""
    return span // timedelta(milliseconds=1)


def describe(span: timedelta) -> str:
    """A span as operators read it: "45 s", "12 min", "3.5 h" (rounded up)."""
    seconds = math.ceil(span.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"


EPOCH = datetime.fromtimestamp(0, UTC)


SYSTEM = SystemClock()
