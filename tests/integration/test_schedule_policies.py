"""Schedule policies (issue 38, part 5): an operator's backfill fires each missed slot once under
the schedule's overlap policy; `pause_on_failure` switches a schedule off after its runs
failed in a row, the reason kept; `catch_up_within_s` bounds the boot catch-up."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from orchestrator.api import tokens
from orchestrator.clock import FrozenClock
from orchestrator.models import Notification, SchedulerState, TaskHistory
from orchestrator.runs.start import new_run_id
from orchestrator.scheduler import policies
from orchestrator.scheduler.catchup import catch_up
from orchestrator.scheduler.dispatch import fire_static
from orchestrator.scheduler.dynamic import Scheduler
from orchestrator.scheduler.fire import Outcome
from orchestrator.scheduler.switch import switch_static
from orchestrator.scheduler.sync import sync
from orchestrator.slots import IntervalSlots, jitter
from orchestrator.states import RunState
from tasks import Overlap, every, registry
from tasks.definition import TaskDefinition
from tasks.registry import Registry
from tests.support.runs import clear_scheduler_locks
from tests.support.users import operator

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "test-noop"  # overlap="allow"
HOUR = 3600


def _install(definition: TaskDefinition) -> None:
    found = registry.get()
    swapped = [definition if d.id == definition.id else d for d in found.values()]
    registry.install(Registry(swapped, found.triggers.values(), found.limits.values()))


@pytest.fixture
def scheduled() -> Iterator[TaskDefinition]:
    """test-noop on an hourly schedule that pauses after 2 failures and catches up within
    10 minutes, synced into beat."""
    clear_scheduler_locks()
    original = registry.get()
    definition = dataclasses.replace(
        original[TASK], schedule=every("1h", pause_on_failure=2, catch_up_within_s=600)
    )
    _install(definition)
    try:
        sync()
        yield definition
    finally:
        registry.install(original)


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})


def _backfill(client: Client, body: dict[str, Any]) -> Any:
    return client.post(
        "/api/v1/schedules/backfill", json.dumps(body), content_type="application/json"
    )


def _hour(moment: datetime) -> datetime:
    return datetime.fromtimestamp(int(moment.timestamp()) // HOUR * HOUR, UTC)


def test_a_backfill_fires_each_missed_slot_once(scheduled: TaskDefinition, client: Client) -> None:
    current = _hour(timezone.now())  # the scheduler's: never backfilled
    slots = [current - timedelta(hours=n) for n in (4, 3, 2, 1)]
    window = {"name": TASK, "from": slots[0].isoformat(), "to": timezone.now().isoformat()}

    answer = _backfill(client, window)
    assert answer.status_code == 200, answer.content
    found = answer.json()
    started = [datetime.fromisoformat(s["slot"]) for s in found["started"]]
    assert started == slots and found["present"] == found["skipped"] == []
    runs = TaskHistory.objects.filter(task_id=TASK)
    assert runs.count() == 4
    assert all(r.trigger["kind"] == "schedule" and r.trigger["backfill"] for r in runs)

    again = _backfill(client, window).json()
    assert again["started"] == [] and len(again["present"]) == 4
    assert TaskHistory.objects.filter(task_id=TASK).count() == 4
    # The last run started is the schedule's last run: the next fire's overlap check reads it.
    last = SchedulerState.objects.get(key=TASK).last_run_id
    assert last == found["started"][-1]["run_id"]


def test_a_backfill_of_a_schedule_that_never_stacks_starts_one_run(
    scheduled: TaskDefinition, client: Client
) -> None:
    _install(dataclasses.replace(scheduled, overlap=Overlap.SKIP))
    start = _hour(timezone.now()) - timedelta(hours=4)
    found = _backfill(client, {"name": TASK, "from": start.isoformat(), "to": "2100-01-01T00:00Z"})
    body = found.json()
    assert len(body["started"]) == 1 and len(body["skipped"]) == 3
    assert {s["run_id"] for s in body["skipped"]} == {body["started"][0]["run_id"]}


def test_a_bad_backfill_is_refused_and_starts_nothing(
    scheduled: TaskDefinition, client: Client
) -> None:
    now = timezone.now().isoformat()
    day_ago = (timezone.now() - timedelta(days=1)).isoformat()
    months_ago = (timezone.now() - timedelta(days=60)).isoformat()
    cases = [
        ({"name": "nothing-here", "from": now, "to": now}, 404, None),
        ({"name": TASK, "from": now, "to": day_ago}, 422, "from"),  # after `to`
        ({"name": TASK, "from": months_ago, "to": now}, 422, "to"),  # 1,440 slots
        ({"name": TASK, "from": "2026-01-01T00:00:00", "to": now}, 422, "from"),  # no offset
    ]
    for body, status, field in cases:
        answer = _backfill(client, body)
        assert answer.status_code == status, (body, answer.content)
        if field is not None:
            assert field in [e["loc"][-1] for e in answer.json()["errors"]], answer.json()
    assert not TaskHistory.objects.exists()


def _scheduled_run(state: RunState, age_s: int) -> None:
    TaskHistory.objects.create(
        id=new_run_id(),
        priority=5,
        task_id=TASK,
        state=state,
        trigger={"kind": "schedule"},
        input={},
        identity=f"{state}-{age_s}",
        created_at=timezone.now() - timedelta(seconds=age_s),
    )


def test_a_schedule_whose_runs_fail_in_a_row_switches_itself_off(
    scheduled: TaskDefinition,
) -> None:
    _scheduled_run(RunState.FAILED, 30)
    _scheduled_run(RunState.COMPLETED, 20)
    _scheduled_run(RunState.FAILED, 10)
    assert Scheduler().tick().paused == []  # a success broke the row
    assert PeriodicTask.objects.get(name=TASK).enabled

    _scheduled_run(RunState.FAILED, 5)
    report = Scheduler().tick()
    assert report.paused == [TASK]
    assert not PeriodicTask.objects.get(name=TASK).enabled
    reason = SchedulerState.objects.get(key=TASK).last_error
    assert reason == "switched off: its last 2 runs failed in a row (pause_on_failure)"
    (told,) = Notification.objects.filter(kind="schedule_paused")
    assert (told.subject, told.title) == (TASK, f"Schedule switched off: {TASK}")
    assert Scheduler().tick().paused == []  # off: not looked at again

    # Switched back on, it counts afresh: the failures that paused it do not pause it again.
    assert switch_static(TASK, enabled=True, actor="ops")
    assert SchedulerState.objects.get(key=TASK).last_error == ""
    assert Scheduler().tick().paused == []
    assert PeriodicTask.objects.get(name=TASK).enabled


def test_the_boot_catch_up_fires_only_within_catch_up_within_s(
    scheduled: TaskDefinition,
) -> None:
    slot = _hour(timezone.now()) + timedelta(hours=1)
    SchedulerState.objects.create(
        key=TASK, task_id=TASK, last_fired_at=slot - timedelta(hours=3), last_bucket=0
    )
    late = catch_up(clock=FrozenClock(slot + timedelta(seconds=700)))
    assert late.outside == [TASK] and late.fired == []
    # Beat sends an overdue row as it starts: declined too.
    assert fire_static(TASK, clock=FrozenClock(slot + timedelta(seconds=700))).outcome is (
        Outcome.DECLINED
    )
    assert not TaskHistory.objects.exists()
    clear_scheduler_locks()
    in_time = catch_up(clock=FrozenClock(slot + timedelta(seconds=100)))
    assert in_time.fired == [TASK]
    assert TaskHistory.objects.get(task_id=TASK).trigger["catchUp"] is True


def test_a_jittered_slot_fires_its_delay_into_the_slot_on_every_replica(
    scheduled: TaskDefinition, client: Client
) -> None:
    _install(dataclasses.replace(scheduled, schedule=every("1h", jitter_s=1200)))
    slot = next(
        s
        for s in range(int(timezone.now().timestamp()) // HOUR * HOUR + HOUR, 10**10, HOUR)
        if jitter(TASK, s, 1200) > 1
    )
    delay = jitter(TASK, slot, 1200)
    assert delay == jitter(TASK, slot, 1200) <= 1200  # the same on every replica

    at_start = datetime.fromtimestamp(slot, UTC)
    assert fire_static(TASK, clock=FrozenClock(at_start)).outcome is Outcome.DECLINED
    replicas = [Scheduler(clock=FrozenClock(at_start + timedelta(seconds=delay - 1)))]
    assert replicas[0].tick().fired == []
    replicas = [Scheduler(clock=FrozenClock(at_start + timedelta(seconds=delay))) for _ in "ab"]
    assert sum(len(r.tick().fired) for r in replicas) == 1
    # A slot's jitter never leaves the tick less than its on-time window before the next one.
    assert all(
        policies.fire_delay(IntervalSlots(timedelta(minutes=1)), TASK, s, 3600) <= 30
        for s in range(0, 60 * 500, 60)
    )
    run = TaskHistory.objects.get(task_id=TASK)
    assert run.trigger["slot"] == at_start.isoformat()

    # An operator's jitter must be shorter than the interval.
    body = {"name": TASK, "every_s": 60, "jitter_s": 60}
    answer = client.post(
        "/api/v1/schedules/static/override", json.dumps(body), content_type="application/json"
    )
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"][-1] == "jitter_s"
