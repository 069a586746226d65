"""Schedules in a time zone (issue 38): the fires one function computes, read through the public
route, across both of 2027's daylight-saving changes in Berlin and New York; the scheduler's
tick firing by that same function on a clock passed in; bad zones refused."""

from __future__ import annotations

import dataclasses
import itertools
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from lumastra import config
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.clock import FrozenClock
from orchestrator.models import TaskHistory
from orchestrator.scheduler.dynamic import Scheduler
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from tasks import cron
from tests.support.runs import clear_scheduler_locks
from tests.support.users import PASSWORD, account

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "test-noop"  # registered, takes no input


@pytest.fixture(autouse=True)
def _no_bucket_locks() -> None:
    clear_scheduler_locks()


@pytest.fixture
def client() -> Client:
    viewer = account("viewer", Access.VIEW)
    return Client(headers={"Authorization": f"Bearer {tokens.issue(viewer)[1]}"})


def _cron_row(name: str, expression: str, tz: str, task: str = DISPATCH_TASK) -> None:
    minute, hour, day_of_month, month_of_year, day_of_week = expression.split()
    crontab = CrontabSchedule.objects.create(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
        timezone=tz,
    )
    PeriodicTask.objects.create(name=name, task=task, crontab=crontab)


def _fires(client: Client, **query: Any) -> list[str]:
    response = client.get("/api/v1/schedules/fires", query)
    assert response.status_code == 200, response.content
    return list(response.json()["fires"])


# name, cron, zone, after, the fires expected (local, with the offset in force)
DST_TABLE = [
    (
        "berlin-spring",
        "30 2 * * *",
        "Europe/Berlin",
        "2027-03-27T00:00:00+01:00",
        # 02:30 does not exist on 28 March: once, at the first instant after the gap.
        ["2027-03-27T02:30:00+01:00", "2027-03-28T03:00:00+02:00", "2027-03-29T02:30:00+02:00"],
    ),
    (
        "berlin-fall",
        "30 2 * * *",
        "Europe/Berlin",
        "2027-10-30T00:00:00+02:00",
        # 02:30 occurs twice on 31 October: once, at its first occurrence (summer time).
        ["2027-10-30T02:30:00+02:00", "2027-10-31T02:30:00+02:00", "2027-11-01T02:30:00+01:00"],
    ),
    (
        "new-york-spring",
        "30 2 * * *",
        "America/New_York",
        "2027-03-13T00:00:00-05:00",
        ["2027-03-13T02:30:00-05:00", "2027-03-14T03:00:00-04:00", "2027-03-15T02:30:00-04:00"],
    ),
    (
        "new-york-fall",
        "30 1 * * *",
        "America/New_York",
        "2027-11-06T00:00:00-04:00",
        ["2027-11-06T01:30:00-04:00", "2027-11-07T01:30:00-04:00", "2027-11-08T01:30:00-05:00"],
    ),
    (
        # `*` in the hour field runs by the wall clock (cronie): the skipped hour has no
        # fire, the repeated hour fires in both passes, each its own instant.
        "berlin-hourly-spring",
        "0 * * * *",
        "Europe/Berlin",
        "2027-03-28T00:30:00+01:00",
        ["2027-03-28T01:00:00+01:00", "2027-03-28T03:00:00+02:00", "2027-03-28T04:00:00+02:00"],
    ),
    (
        "berlin-hourly-fall",
        "0 * * * *",
        "Europe/Berlin",
        "2027-10-31T01:30:00+02:00",
        ["2027-10-31T02:00:00+02:00", "2027-10-31T02:00:00+01:00", "2027-10-31T03:00:00+01:00"],
    ),
]


@pytest.mark.parametrize(
    ("name", "expression", "zone", "after", "expected"),
    DST_TABLE,
    ids=[row[0] for row in DST_TABLE],
)
def test_cron_fires_across_daylight_saving(
    client: Client, name: str, expression: str, zone: str, after: str, expected: list[str]
) -> None:
    _cron_row(name, expression, zone)

    fires = _fires(client, name=name, after=after, count=3)

    assert fires == expected
    instants = [datetime.fromisoformat(f) for f in fires]
    assert instants == sorted(set(instants))  # none twice, none out of order
    assert all(i > datetime.fromisoformat(after) for i in instants)  # none in the past


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
def test_an_interval_is_elapsed_time_across_the_clock_change(client: Client, zone: str) -> None:
    every = IntervalSchedule.objects.create(every=15, period=IntervalSchedule.MINUTES)
    PeriodicTask.objects.create(name="interval", task=DISPATCH_TASK, interval=every)
    fall = {"Europe/Berlin": "2027-10-31T00:20:00Z", "America/New_York": "2027-11-07T05:20:00Z"}

    settings.CONFIG = dataclasses.replace(settings.CONFIG, time_zone=zone)
    try:
        fires = _fires(client, name="interval", after=fall[zone], count=6)
    finally:
        settings.CONFIG = dataclasses.replace(settings.CONFIG, time_zone="UTC")

    instants = [datetime.fromisoformat(f) for f in fires]
    assert [b - a for a, b in itertools.pairwise(instants)] == [timedelta(minutes=15)] * 5
    # The hour the clock falls back over shows both of its offsets, a quarter hour apart.
    assert len({f[-6:] for f in fires}) == 2


def test_a_task_s_schedule_is_read_from_its_definition_before_it_is_synced(
    client: Client,
) -> None:
    # Nothing synced here: `history-retention`'s `every("1d")` comes from its definition.
    fires = _fires(client, name="history-retention", after="2031-01-01T00:00:00Z", count=2)
    assert fires == ["2031-01-02T00:00:00Z", "2031-01-03T00:00:00Z"]
    dynamic = client.get(
        "/api/v1/schedules/fires", {"name": "epg-refresh", "row": "no-such-row", "count": 1}
    )
    assert dynamic.status_code == 404 and "no-such-row" in dynamic.json()["detail"]


def test_bad_queries_are_refused_naming_what_is_wrong(client: Client) -> None:
    _cron_row("berlin", "30 2 * * *", "Europe/Berlin")
    unknown = client.get("/api/v1/schedules/fires", {"name": "no-such-schedule"})
    assert unknown.status_code == 404 and "no-such-schedule" in unknown.json()["detail"]
    _cron_row("own-row", "30 2 * * *", "Europe/Berlin", task="an.own.task")
    own = client.get("/api/v1/schedules/fires", {"name": "own-row"})
    assert own.status_code == 409 and "beat alone" in own.json()["detail"]
    for query, field in (
        ({"name": "berlin", "after": "2027-03-27T00:00:00"}, "after"),  # no offset
        ({"name": "berlin", "after": "yesterday"}, "after"),
        ({"name": "berlin", "after": "9999-06-01T00:00:00Z"}, "after"),
        ({"name": "berlin", "after": "0001-01-01T00:00:00Z"}, "after"),
        ({"name": "berlin", "count": 0}, "count"),
        ({"name": "berlin", "count": 51}, "count"),
    ):
        response = client.get("/api/v1/schedules/fires", query)
        assert response.status_code == 422, (query, response.content)
        assert field in response.content.decode()


def test_an_unknown_zone_is_refused_where_it_is_declared() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        cron("30 2 * * *", tz="Mars/Olympus")
    with pytest.raises(config.ConfigError, match="LUMASTRA_TIME_ZONE='Europe'"):
        config.load({"LUMASTRA_TIME_ZONE": "Europe"})


def _tick_at(moment: str) -> list[str]:
    clock = FrozenClock(datetime.fromisoformat(moment))
    return Scheduler(definitions=[], clock=clock).tick().fired


def test_the_tick_fires_each_slot_once_at_the_moment_the_function_names() -> None:
    _cron_row(TASK, "30 2 * * *", "Europe/Berlin", task=DISPATCH_TASK)
    key = state_key(TASK)

    # Spring: nothing at 01:59 CET; at 03:00 CEST (the gap's end), one fire; not again.
    assert _tick_at("2027-03-28T00:59:55+00:00") == []
    assert _tick_at("2027-03-28T01:00:05+00:00") == [key]
    assert _tick_at("2027-03-28T01:00:15+00:00") == []
    # Fall: 02:30 CEST fires; 02:30 CET, the same local time an hour later, does not.
    assert _tick_at("2027-10-31T00:30:05+00:00") == [key]
    assert _tick_at("2027-10-31T01:30:05+00:00") == []

    slots = [
        run.trigger["slot"]
        for run in TaskHistory.objects.filter(task_id=TASK).order_by("created_at")
    ]
    assert slots == [
        datetime(2027, 3, 28, 1, 0, tzinfo=UTC).isoformat(),
        datetime(2027, 10, 31, 0, 30, tzinfo=UTC).isoformat(),
    ]


def test_a_cron_that_names_no_moment_is_an_error_of_its_own_not_of_the_tick() -> None:
    _cron_row("never", "0 0 31 2 *", "UTC")  # 31 February
    _cron_row(TASK, "30 2 * * *", "Europe/Berlin")

    report = Scheduler(
        definitions=[], clock=FrozenClock(datetime.fromisoformat("2027-03-28T01:00:05+00:00"))
    ).tick()

    assert report.errors == 1 and report.fired == [state_key(TASK)]


def test_the_schedules_page_shows_the_next_five_in_the_zone_and_in_utc() -> None:
    _cron_row("berlin", "30 2 * * *", "Europe/Berlin")
    browser = Client()
    assert browser.login(username=account("viewer", Access.VIEW).username, password=PASSWORD)

    page = browser.get("/admin/orchestrator/taskhistory/schedules/").content.decode()

    row = page[page.index('id="static-berlin"') :]
    row = row[: row.index("</tr>")]
    assert "cron &#x27;30 2 * * *&#x27; (Europe/Berlin)" in row
    shown = re.findall(r"<li>(.*?)</li>", row)
    assert len(shown) == 5
    for line in shown:
        # "2031-05-02 02:30 CEST · 2031-05-02 00:30 UTC" (03:00 on a spring-forward day)
        assert re.fullmatch(r"\S+ (02:30|03:00) CES?T · \S+ 0[01]:[03]0 UTC", line), line
