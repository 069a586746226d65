"""Schedule strings: intervals ('15m') and five-field cron expressions, checked for shape."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tasks import cron, define_task, every
from tasks.errors import ManifestError
from tasks.schedule import Cron, Every, parse_interval, parse_schedule


def _noop(ctx: object, params: object) -> None:
    return None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("6h", timedelta(hours=6)),
        ("1d", timedelta(days=1)),
        (" 15m ", timedelta(minutes=15)),
    ],
)
def test_intervals(text: str, expected: timedelta) -> None:
    assert parse_interval(text) == expected
    assert parse_schedule(text) == Every(expected)


@pytest.mark.parametrize("text", ["15x", "0m", "m", "15", "-5m", "1.5h", "15 m", "15M", ""])
def test_bad_intervals(text: str) -> None:
    with pytest.raises(ValueError, match="bad interval"):
        parse_interval(text)


def test_every_keeps_its_env_override() -> None:
    assert every("1h", env_override="LUMASTRA_X") == Every(timedelta(hours=1), "LUMASTRA_X")


@pytest.mark.parametrize("expression", ["* * * * *", "0 */6 * * mon-fri", "5,35 3 1 1-6 0"])
def test_five_field_cron(expression: str) -> None:
    assert parse_schedule(expression) == Cron(expression)
    assert cron(expression).fields() == expression.split()


@pytest.mark.parametrize(
    "expression",
    [
        "* * * *",  # four fields
        "0 0 * * * *",  # six fields (seconds are not supported)
        "61 * * * *",  # minute out of range
        "* 24 * * *",  # hour out of range
        "* * 32 * *",  # day of month out of range
        "* * * 13 *",  # month out of range
        "* * * * 8",  # day of week out of range
        "*/0 * * * *",  # zero step
        "a b c d e",
    ],
)
def test_bad_cron(expression: str) -> None:
    with pytest.raises(ValueError):
        parse_schedule(expression)


def test_schedule_objects_pass_through() -> None:
    schedule = every("15m")
    assert parse_schedule(schedule) is schedule


@pytest.mark.parametrize("schedule", ["15x", "* * * *", "61 * * * *", "", 15])
def test_define_task_names_the_schedule_field(schedule: object) -> None:
    with pytest.raises(ManifestError) as caught:
        define_task(
            id="scheduled",
            resource_class="maintenance",
            execute=_noop,
            schedule=schedule,
        )

    assert (caught.value.task_id, caught.value.field) == ("scheduled", "schedule")
    assert "'scheduled'" in str(caught.value) and "'schedule'" in str(caught.value)


def test_define_task_accepts_both_kinds_of_schedule() -> None:
    interval = define_task(id="a", resource_class="maintenance", execute=_noop, schedule="15m")
    crontab = define_task(id="b", resource_class="maintenance", execute=_noop, schedule="0 3 * * *")

    assert interval.schedule == Every(timedelta(minutes=15))
    assert crontab.schedule == Cron("0 3 * * *")


def test_schedule_policies_are_checked_when_declared() -> None:
    policies = every("1h", pause_on_failure=3, catch_up_within_s=600).policies
    assert (policies.pause_on_failure, policies.catch_up_within_s) == (3, 600)
    assert cron("0 3 * * *", pause_on_failure=1).policies.pause_on_failure == 1
    for bad in ({"pause_on_failure": 0}, {"catch_up_within_s": True}, {"pause_on_failure": "3"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            every("1h", **bad)
