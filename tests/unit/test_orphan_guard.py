"""Pure parts of orphan recovery: the state-hash guard and the drain's entry format."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.recovery.orphans import LiveView
from orchestrator.runs.drain import Entry

NOW = 1_800_000_000_000  # ms, Valkey's clock


@pytest.mark.parametrize(
    ("state", "beat_age_s", "reason"),
    [
        (None, None, "live hash gone"),
        ("completed", 1, "live hash gone"),  # not a live state: a stray field, not a run
        ("active", None, "live hash without a heartbeat"),
        ("active", 300, "live hash heartbeat 300s old"),
        ("active", 301, "live hash heartbeat 301s old"),
        ("active", 299, None),
        ("cancelling", 5, None),
        ("cancelling", 400, "live hash heartbeat 400s old"),
    ],
)
def test_the_guard_confirms_only_a_gone_or_stale_hash(
    state: str | None, beat_age_s: int | None, reason: str | None
) -> None:
    beat = None if beat_age_s is None else NOW - beat_age_s * 1000
    view = LiveView(state, "host:1:X", beat, NOW)

    assert view.stale_reason(300) == reason


def test_a_drain_entry_round_trips_with_its_datetimes() -> None:
    at = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
    entry = Entry(
        "run_1",
        "completed",
        {"result": {"n": 2**60}, "finished_at": at.isoformat()},
        "host:1:X",
        attempts=3,
    )

    again = Entry.from_json(entry.to_json())

    assert again == entry
    assert again.call_args() == {"result": {"n": 2**60}, "finished_at": at}


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        '{"run_id": "run_1"}',
        '{"fields": []}',
        "null",
        '{"run_id": "run_1", "target": "completed", "call": "transition", "args": {}}',
    ],
)
def test_a_malformed_drain_entry_is_refused(raw: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        Entry.from_json(raw)
