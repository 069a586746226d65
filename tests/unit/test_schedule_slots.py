"""Slots (buckets) of intervals and cron expressions, and dynamic schedule rows: pure logic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.scheduler.names import bucket_label, state_key
from orchestrator.slots import CronSlots, IntervalSlots, jitter
from tasks import ScheduleRow, define_task, dynamic
from tasks.errors import ManifestError
from tasks.schedule import Dynamic, to_row


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_an_interval_slot_is_the_epoch_aligned_floor() -> None:
    slots = IntervalSlots(timedelta(minutes=15))

    assert slots.slot(at("2031-01-01T10:14:59")) == int(at("2031-01-01T10:00").timestamp())
    assert slots.slot(at("2031-01-01T10:15:00")) == int(at("2031-01-01T10:15").timestamp())


def test_an_interval_is_missed_only_after_a_full_interval() -> None:
    slots = IntervalSlots(timedelta(hours=1))
    last = at("2031-01-01T10:00")

    assert not slots.missed(last, last + timedelta(minutes=60))
    assert slots.missed(last, last + timedelta(minutes=61))


@pytest.mark.parametrize(
    ("expression", "now", "previous"),
    [
        ("0 3 * * *", "2031-01-02T03:00:30", "2031-01-02T03:00"),
        ("0 3 * * *", "2031-01-02T02:59", "2031-01-01T03:00"),
        ("*/15 * * * *", "2031-01-01T10:44:59", "2031-01-01T10:30"),
        ("30 9 * * mon", "2031-01-08T09:00", "2031-01-06T09:30"),  # 01-08 is a Wednesday
        ("0 0 1 1 *", "2031-06-01T00:00", "2031-01-01T00:00"),
        ("5,35 3 * * *", "2031-01-01T03:20", "2031-01-01T03:05"),
    ],
)
def test_a_cron_slot_is_the_latest_moment_it_names(
    expression: str, now: str, previous: str
) -> None:
    assert CronSlots(expression).previous(at(now)) == at(previous)
    assert CronSlots(expression).slot(at(now)) == int(at(previous).timestamp())


def test_a_cron_is_missed_when_a_moment_passed_since_the_last_fire() -> None:
    slots = CronSlots("0 3 * * *")

    assert not slots.missed(at("2031-01-01T03:00:02"), at("2031-01-02T02:59"))
    assert slots.missed(at("2031-01-01T03:00:02"), at("2031-01-02T03:00"))


def test_keys_and_bucket_labels() -> None:
    assert state_key("epg-refresh", "bbc") == "epg-refresh:bbc"
    assert state_key("history-retention") == "history-retention"
    assert bucket_label(1_700_000_000) == "1700000000"
    assert bucket_label(1_700_000_000, "bbc") == "bbc@1700000000"


def test_rows_are_normalised_and_bad_ones_named() -> None:
    assert to_row(("a", {"x": 1}, "15m")) == ScheduleRow("a", {"x": 1}, timedelta(minutes=15))
    assert to_row(ScheduleRow("b")).interval == timedelta(minutes=15)
    with pytest.raises(ValueError, match="row 'c'"):
        to_row(("c", {}, "soon"))
    with pytest.raises(ValueError, match="non-empty"):
        to_row(("", {}, "1m"))
    with pytest.raises(ValueError, match="mapping"):
        to_row(("d", [1], "1m"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ScheduleRow"):
        to_row("e")  # type: ignore[arg-type]


def test_a_task_may_declare_a_dynamic_schedule() -> None:
    def loader() -> list[ScheduleRow]:
        return []

    definition = define_task(
        id="dyn", resource_class="io", execute=lambda c, p: None, schedule=dynamic(loader)
    )

    assert definition.schedule == Dynamic(loader)
    with pytest.raises(TypeError):
        dynamic("not callable")  # type: ignore[arg-type]
    with pytest.raises(ManifestError):
        define_task(id="dyn", resource_class="io", execute=lambda c, p: None, schedule="soon")


@pytest.mark.parametrize("expression", ["30 2 * * *", "0 * * * *", "*/20 1-3 * * *"])
@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
def test_a_cron_s_slot_is_the_last_of_its_fires_across_both_clock_changes(
    expression: str, zone: str
) -> None:
    """What the scheduler fires (`slot`) and what every view shows (`fires`) agree, minute by
    minute through 2027's two transition days, and no fire repeats an instant."""
    slots = CronSlots(expression, zone)
    for day in ("2027-03-14", "2027-03-28", "2027-10-31", "2027-11-07"):
        start = at(f"{day}T00:00") - timedelta(days=1)
        fires = slots.fires(start, 200)
        assert fires == sorted(set(fires))
        for minute in range(0, 48 * 60, 7):
            now = start + timedelta(minutes=minute)
            passed = [f for f in fires if f <= now]
            if passed:
                assert slots.previous(now) == passed[-1], (day, now)


def test_a_gap_s_end_that_is_also_the_next_day_s_fire_is_listed_once() -> None:
    """America/Nuuk skips its Saturday 23:00 into Sunday 00:00 (2024-03-30): the skipped 23:00
    fires at the gap's end, which is Sunday's own 00:00 fire, one instant."""
    slots = CronSlots("0 0,23 * * *", "America/Nuuk")
    fires = slots.fires(at("2024-03-30T12:00"), 4)
    assert fires == sorted(set(fires)) and len(fires) == 4
    assert at("2024-03-31T01:00") in fires


def test_jitter_is_the_same_everywhere_and_spreads_over_its_range() -> None:
    delays = [jitter("nightly-scan", slot, 300) for slot in range(0, 86_400 * 1000, 86_400)]
    assert delays == [jitter("nightly-scan", s, 300) for s in range(0, 86_400 * 1000, 86_400)]
    assert min(delays) >= 0 and max(delays) <= 300
    assert len(set(delays)) > 200  # spread, not one fixed offset
    assert jitter("nightly-scan", 0, 0) == 0
