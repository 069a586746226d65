"""The conversions every store and page shares (orchestrator/clock.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.clock import describe, span_ms
from orchestrator.stores import valkey
from orchestrator.stores.valkey import time_ms


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(seconds=0), "0 s"),
        (timedelta(seconds=44.2), "45 s"),  # rounded up: never sooner than said
        (timedelta(seconds=119), "119 s"),
        (timedelta(seconds=120), "2 min"),
        (timedelta(minutes=119), "119 min"),
        (timedelta(minutes=119, seconds=1), "2.0 h"),
        (timedelta(minutes=180), "3.0 h"),
        (timedelta(hours=26), "26.0 h"),
    ],
)
def test_a_span_reads_in_seconds_minutes_or_hours(span: timedelta, text: str) -> None:
    assert describe(span) == text


def test_milliseconds_round_trip() -> None:
    moment = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)

    assert valkey.from_ms(valkey.to_ms(moment)) == moment
    assert valkey.from_ms(str(valkey.to_ms(moment))) == moment
    assert span_ms(timedelta(seconds=1.5)) == 1500


def test_valkey_time_is_read_as_lua_reads_it() -> None:
    assert time_ms(("1800000000", "999999")) == 1_800_000_000_999
    assert time_ms((1800000000, 1000)) == 1_800_000_000_001
