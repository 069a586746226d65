"""Backfill (issue 38): an operator fires the slots a static schedule missed between two
moments, each once, under the schedule's overlap policy (`POST /api/v1/schedules/backfill`).

The slots are the schedule's own (`overview.schedule`, the function the scheduler fires by,
the operator's cadence included) from `start` to `end`, both included, and older than the
current slot (that one is the scheduler's to fire: the tick, beat, the boot catch-up only ever
fire the current slot, so no slot is fired by both). A slot is missed when no run of the task
carries it in its trigger (`trigger.slot`, as a fire writes it): a slot the scheduler skipped
(its previous run still live), one admission refused, one no process fired (the cluster was
down). Each missed slot starts a run with trigger kind `schedule`, `backfill: true` and the
slot, oldest first, and the last one started becomes the schedule's last run
(`scheduler_state.last_run_id`), which the next fire's overlap check reads:
- `overlap="skip"` (the default): a slot whose previous run (the schedule's last fire, or the
  backfill's previous start) is still live starts nothing and is answered skipped; so a
  backfill of a schedule that never stacks starts one run at most.
- `overlap="queue"` or `"allow"`: every missed slot starts its run.
The backfill holds a transaction-scoped advisory lock on the schedule, so two backfills of one
schedule at once do not start a slot twice; its runs are published when it commits.

Not guaranteed: a run deleted by retention no longer marks its slot, which a later backfill
fires again. At most MAX_SLOTS slots per call (a 422 names the count otherwise).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models.fields.json import KT

from orchestrator.hooks.base import Refused
from orchestrator.models import SchedulerState, TaskHistory
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.start import start_run
from orchestrator.scheduler import overview
from orchestrator.scheduler.fire import FireRequest, still_live, trigger_of
from orchestrator.scheduler.names import state_key
from orchestrator.scheduler.sync import static_definitions
from orchestrator.triggers import TriggerKind

log = logging.getLogger(__name__)

MAX_SLOTS = 1000


class BadRange(ValueError):
    """`field` (start or end) is what is wrong with the range."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


class TooManySlots(BadRange):
    pass


class NotScheduled(LookupError):
    """A beat row left behind by a task that no longer declares a static schedule."""


@dataclass
class Backfilled:
    started: list[tuple[datetime, str]] = field(default_factory=list)  # (slot, run id)
    present: list[datetime] = field(default_factory=list)  # a run carries the slot already
    skipped: list[tuple[datetime, str]] = field(default_factory=list)  # (slot, the live run)
    refused: list[tuple[datetime, str]] = field(default_factory=list)  # (slot, why)


def _slot_text(moment: datetime) -> str:
    return datetime.fromtimestamp(int(moment.timestamp()), UTC).isoformat()


def backfill(name: str, start: datetime, end: datetime, now: datetime, *, by: str) -> Backfilled:
    """Fire the slots of static schedule `name` from `start` to `end` that no run carries."""
    slots = overview.schedule(name, None)  # UnknownSchedule, NotOurs
    if name not in {d.id for d in static_definitions()}:
        raise NotScheduled(f"task {name!r} no longer declares a static schedule")
    if start > end:
        raise BadRange("start", "from is after to")
    if start.year < 1970 or end.year > 9000:
        raise BadRange("start" if start.year < 1970 else "end", "outside the years 1970-9000")
    last = min(end, now)
    current = slots.slot(now)
    first = start - timedelta(microseconds=1)  # fires() answers strictly after
    moments = [
        m for m in slots.fires(first, MAX_SLOTS + 1) if m <= last and m.timestamp() < current
    ]
    if len(moments) > MAX_SLOTS:
        raise TooManySlots("end", f"more than {MAX_SLOTS} slots from {start} to {last}; split it")
    done = Backfilled()
    key = state_key(name)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"backfill:{key}"])
        carried = set(
            TaskHistory.objects.alias(kind=KT("trigger__kind"), slot=KT("trigger__slot"))
            .filter(task_id=name, kind=TriggerKind.SCHEDULE.value)
            .filter(slot__in=[_slot_text(m) for m in moments])
            .values_list("trigger__slot", flat=True)
        )
        previous = (
            SchedulerState.objects.filter(key=key).values_list("last_run_id", flat=True).first()
        )
        for moment in moments:
            if _slot_text(moment) in carried:
                done.present.append(moment)
                continue
            if live := still_live(name, previous):
                done.skipped.append((moment, live[0]))
                continue
            request = FireRequest(name, int(moment.timestamp()), backfill=True)
            try:
                with transaction.atomic():
                    handle = start_run(name, {}, trigger=trigger_of(request))
            except (StartRefused, Refused) as exc:
                done.refused.append((moment, f"{type(exc).__name__}: {exc}"))
                continue
            if handle.dropped:
                done.refused.append((moment, "dropped: the queue is full (backpressure)"))
            elif handle.deduplicated:
                done.skipped.append((moment, handle.run_id))
            else:
                done.started.append((moment, handle.run_id))
                previous = handle.run_id
        if done.started:
            SchedulerState.objects.update_or_create(
                key=key, defaults={"task_id": name, "last_run_id": done.started[-1][1]}
            )
    log.warning(
        "schedule %s backfilled by %s from %s to %s: %d started, %d present, %d skipped, "
        "%d refused",
        name,
        by,
        start,
        last,
        len(done.started),
        len(done.present),
        len(done.skipped),
        len(done.refused),
    )
    return done
