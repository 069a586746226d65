"""The operator owns the cadence (issue 38): an override per schedule, static or dynamic row,
kept by `sync_schedules`, dropped by a reset, refused with the field named, and taking effect
on every replica at its next tick without firing a slot twice."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from coverage.models import EpgSource
from orchestrator.api import tokens
from orchestrator.clock import FrozenClock
from orchestrator.models import ScheduleOverride, TaskHistory
from orchestrator.scheduler import overrides
from orchestrator.scheduler.dynamic import Scheduler
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from orchestrator.scheduler.sync import sync
from tests.support.runs import clear_scheduler_locks
from tests.support.users import operator

pytestmark = pytest.mark.django_db(transaction=True)

STATIC = "history-retention"  # every 1d, synced from tasks/definitions/maintenance.py
DYNAMIC = "epg-refresh"  # one row per enabled EPG source
TASK = "test-noop"  # registered, takes no input


@pytest.fixture(autouse=True)
def _no_bucket_locks() -> None:
    clear_scheduler_locks()


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")


def _cadence(name: str) -> str:
    row = PeriodicTask.objects.select_related("interval", "crontab").get(name=name)
    if row.crontab is not None:
        c = row.crontab
        return (
            f"{c.minute} {c.hour} {c.day_of_month} {c.month_of_year} {c.day_of_week} {c.timezone}"
        )
    assert row.interval is not None
    return f"every {row.interval.every} {row.interval.period}"


def test_a_static_override_outlives_the_sync_and_a_reset_brings_the_definition_back(
    client: Client,
) -> None:
    sync()
    assert _cadence(STATIC) == "every 1 days"

    body = {"name": STATIC, "cron": "30 2 * * *", "tz": "Europe/Berlin"}
    answer = _post(client, "/schedules/static/override", body)

    assert answer.status_code == 200, answer.content
    assert answer.json()["cadence"] == "cron '30 2 * * *' (Europe/Berlin)"
    assert answer.json()["actor"] == "ops"
    assert _cadence(STATIC) == "30 2 * * * Europe/Berlin"
    sync()  # a deploy
    assert _cadence(STATIC) == "30 2 * * * Europe/Berlin"
    listed = {s["name"]: s for s in client.get("/api/v1/schedules").json()["static"]}
    assert listed[STATIC]["override"]["actor"] == "ops"
    assert listed[STATIC]["tz"] == "Europe/Berlin"
    fires = client.get(
        "/api/v1/schedules/fires", {"name": STATIC, "after": "2027-03-27T12:00:00Z", "count": 1}
    ).json()["fires"]
    assert fires == ["2027-03-28T03:00:00+02:00"]

    reset = _post(client, "/schedules/static/reset", {"name": STATIC})
    again = _post(client, "/schedules/static/reset", {"name": STATIC})

    assert reset.json() == {"reset": True} and again.json() == {"reset": False}
    assert _cadence(STATIC) == "every 1 days"
    assert not ScheduleOverride.objects.exists()
    listed = {s["name"]: s for s in client.get("/api/v1/schedules").json()["static"]}
    assert listed[STATIC]["override"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "30 2 * * * *"}, "cron"),  # six fields
        ({"cron": "61 2 * * *"}, "cron"),
        ({"cron": "30 2 * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"every_s": 0}, "every_s"),
        ({"every_s": 60, "tz": "Europe/Berlin"}, "tz"),
        ({"cron": "30 2 * * *", "every_s": 60}, "cron"),
        ({}, "cron"),
        ({"every_s": "60"}, "every_s"),  # not a number
        ({"every_s": 60.5}, "every_s"),
        ({"every_s": True}, "every_s"),
        ({"cron": "30 2 * * *", "jitter": 5}, "jitter"),  # unknown field
        ({"cron": "0 0 31 2 *"}, "cron"),  # 31 February: never
        ({"cron": "0 0 * * " + ",".join(["1"] * 40)}, "cron"),  # longer than beat stores
    ],
)
def test_a_bad_override_is_refused_naming_the_field_and_writes_nothing(
    client: Client, body: dict[str, Any], field: str
) -> None:
    sync()

    answer = _post(client, "/schedules/static/override", {"name": STATIC, **body})

    assert answer.status_code == 422, answer.content
    assert field in [e["loc"][-1] for e in answer.json()["errors"]], answer.json()
    assert not ScheduleOverride.objects.exists()
    assert _cadence(STATIC) == "every 1 days"


def test_overrides_of_what_is_not_there_or_not_synced_are_refused(client: Client) -> None:
    daily = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.DAYS)
    PeriodicTask.objects.create(name="own-row", task="an.own.task", interval=daily)
    cadence = {"every_s": 600}

    assert (
        _post(client, "/schedules/static/override", {"name": "nope", **cadence}).status_code == 404
    )
    own = _post(client, "/schedules/static/override", {"name": "own-row", **cadence})
    assert own.status_code == 409 and "Periodic tasks" in own.json()["detail"]
    row = {"task": "test-noop", "row": "r1", **cadence}
    assert _post(client, "/schedules/dynamic/override", row).status_code == 404
    assert not ScheduleOverride.objects.exists()


def _tick(schedulers: list[Scheduler]) -> list[str]:
    fired = [key for s in schedulers for key in s.tick().fired]
    # The runs end at once: a live run would make the next slot a skip (overlap "skip").
    TaskHistory.objects.filter(task_id=TASK).update(state="completed")
    return fired


def test_three_replicas_fire_each_slot_of_an_edited_cadence_once() -> None:
    hourly = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.HOURS)
    PeriodicTask.objects.create(name=TASK, task=DISPATCH_TASK, interval=hourly)
    t0 = datetime(2031, 1, 1, tzinfo=UTC)
    clock = FrozenClock(t0)
    replicas = [Scheduler(definitions=[], clock=clock) for _ in range(3)]

    fired: list[str] = []
    for step in range(0, 2 * 360):  # two hours of 10 s ticks
        if step == 60:  # 00:10: every half hour from now on; 00:00 has fired already
            overrides.set_static(TASK, overrides.Cadence(cron="*/30 * * * *"), actor="ops")
        fired += _tick(replicas)
        clock.advance(timedelta(seconds=10))

    assert fired == [state_key(TASK)] * 4
    slots = Counter(run.trigger["slot"] for run in TaskHistory.objects.filter(task_id=TASK))
    assert slots == {
        t0.isoformat(): 1,
        (t0 + timedelta(minutes=30)).isoformat(): 1,
        (t0 + timedelta(minutes=60)).isoformat(): 1,
        (t0 + timedelta(minutes=90)).isoformat(): 1,
    }


def test_a_dynamic_row_runs_on_its_override_until_reset(client: Client) -> None:
    EpgSource.objects.create(
        slug="tv1", name="tv1", url="https://tv1.invalid/f", interval_minutes=60
    )
    row = {"task": DYNAMIC, "row": "tv1"}

    answer = _post(client, "/schedules/dynamic/override", {**row, "every_s": 900})

    assert answer.status_code == 200, answer.content
    assert answer.json()["key"] == state_key(DYNAMIC, "tv1")
    fires = client.get(
        "/api/v1/schedules/fires",
        {"name": DYNAMIC, "row": "tv1", "after": "2031-01-01T00:00:00Z", "count": 2},
    ).json()["fires"]
    assert fires == ["2031-01-01T00:15:00Z", "2031-01-01T00:30:00Z"]
    clock = FrozenClock(datetime(2031, 1, 1, tzinfo=UTC))
    scheduler = Scheduler(clock=clock)
    fired = 0
    for _ in range(6 * 60):  # an hour of ticks: every 15 minutes, not every 60
        fired += scheduler.tick().fired.count(state_key(DYNAMIC, "tv1"))
        TaskHistory.objects.filter(task_id=DYNAMIC).update(state="completed")
        clock.advance(timedelta(seconds=10))
    assert fired == 4
    (listed,) = [
        d for d in client.get("/api/v1/schedules").json()["dynamic"] if d["task"] == DYNAMIC
    ]
    assert listed["rows"][0]["override"]["cadence"] == "every 0:15:00"

    assert _post(client, "/schedules/dynamic/reset", row).json() == {"reset": True}
    fires = client.get(
        "/api/v1/schedules/fires",
        {"name": DYNAMIC, "row": "tv1", "after": "2031-01-01T00:00:00Z", "count": 1},
    ).json()["fires"]
    assert fires == ["2031-01-01T01:00:00Z"]
