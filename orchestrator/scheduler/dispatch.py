"""`lumastra.schedule.dispatch(task_id)`: the Celery task every synced beat row calls.

It reads the task's `PeriodicTask` row (one indexed query) for the schedule beat runs, maps
the moment it executes to that schedule's slot, and fires the slot (`fire.fire`). A row that
is gone or disabled by the time the message is taken fires nothing. Returns the outcome's
name, for logs and tests.

Not guaranteed: the slot is computed when the message is executed, not when beat sent it. A
message delivered later than its slot (the queue was backed up) fires the slot it lands in;
if that slot was already fired, it fires nothing: a late message can skip a slot, never
double one.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django_celery_beat.models import PeriodicTask

from orchestrator.clock import SYSTEM, Clock
from orchestrator.models import ScheduleOverride
from orchestrator.runs.runner import task_connections
from orchestrator.scheduler import policies
from orchestrator.scheduler.fire import FireRequest, FireResult, Outcome, fire
from orchestrator.scheduler.names import DISPATCH_TASK
from orchestrator.scheduler.sync import slots_of

log = logging.getLogger(__name__)


def fire_static(task_id: str, *, clock: Clock = SYSTEM, catch_up: bool = False) -> FireResult:
    """Fire the current slot of `task_id`'s synced static schedule."""
    row = (
        PeriodicTask.objects.select_related("interval", "crontab")
        .filter(name=task_id, task=DISPATCH_TASK)
        .first()
    )
    slots = None if row is None or not row.enabled else slots_of(row)
    if slots is None:
        log.info("schedule %s: no enabled interval or cron row; nothing fired", task_id)
        return FireResult(Outcome.ALREADY, error="no enabled schedule row")
    now = clock.now()
    slot = slots.slot(now)
    if catch_up:
        return fire(FireRequest(task_id, slot, catch_up=True), now)
    override = ScheduleOverride.objects.filter(key=task_id).first()
    jitter_s = policies.jitter_of(task_id, override)
    if jitter_s:
        # A jittered slot is the scheduler tick's, when its delay is over.
        delay = policies.fire_delay(slots, task_id, slot, jitter_s)
        return FireResult(Outcome.DECLINED, error=f"jittered: the tick fires it {delay} s in")
    within = policies.of(task_id).catch_up_within_s
    if within is not None and now.timestamp() - slot > max(within, policies.on_time_s()):
        # Beat sends an overdue row at its start: a slot older than the window stays missed.
        return FireResult(Outcome.DECLINED, error="outside catch_up_within_s")
    return fire(FireRequest(task_id, slot), now)


def _dispatch(task_id: str) -> str:
    with task_connections():
        return fire_static(task_id).outcome.value


# Not a decorator: celery is untyped, and mypy strict refuses untyped decorators.
dispatch: Any = shared_task(name=DISPATCH_TASK, ignore_result=True, acks_late=False)(_dispatch)
