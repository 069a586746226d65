"""Backfill (issue 38): an operator fires the slots a static schedule missed between two
moments, each once, under the schedule's overlap policy (`POST /api/v1/schedules/backfill`).

The slots are the schedule's own (`overview.schedule`, the function the scheduler fires by,
the operator's cadence included) from `start` to `end`, both included, and never later than
now. A slot is missed when no run of the task carries it in its trigger (`trigger.slot`, as a
fire writes it): a slot the scheduler skipped (its previous run still live), one admission
refused, one no process fired (the cluster was down). Each missed slot starts a run with
trigger kind `schedule`, `backfill: true` and the slot, oldest first:
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
from orchestrator.runs.start import StartRefused, start_run
from orchestrator.scheduler import overview
from orchestrator.scheduler.fire import FireRequest, still_live, trigger_of
from orchestrator.scheduler.names import state_key
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
    if start > end:
        raise BadRange("start", "from is after to")
    if start.year < 1970 or end.year > 9000:
        raise BadRange("start" if start.year < 1970 else "end", "outside the years 1970-9000")
    last = min(end, now)
    moments = [
        m for m in slots.fires(start - timedelta(microseconds=1), MAX_SLOTS + 1) if m <= last
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
            done.started.append((moment, handle.run_id))
            previous = handle.run_id
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
