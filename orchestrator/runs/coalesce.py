"""Starts that coalesce (issue 39): a debounced task's burst of starts makes one run.

`define_task(..., debounce=Debounce(period_s, max_wait_s))`:
- A start of a debounced task first tries to join the run an earlier start of its identity
  recorded and that still waits: pending, never attempted, not released by the due loop yet
  (`debounce_run.sql`, one UPDATE). It replaces that run's input (the last start wins) and
  moves its time to `period_s` from now, never later than `max_wait_s` after the first start;
  the start is answered `debounced`, naming that run, and nothing else is written or counted
  (no admission: the run was admitted once, when it was recorded).
- When there is none, the start is recorded as a delayed start due in `period_s` (`prepare`
  marks it `trigger.debounce`), through admission like any other; the due loop releases it
  (`runs.due`). Postgres holds the input and the time, so a restart loses neither.
- Two first starts at once: the partial unique index `task_history_debounce_one` (task,
  identity, while waiting) lets one INSERT through; the other conflicts, gives back what its
  admission took and joins the winner (`joined_after_conflict`).

The same in Python (`start_run`), `POST /runs`, `POST /runs:batch` (a later start of the same
identity in one batch joins the earlier one) and the inbound triggers (they call `start_run`).

A debounced task's identity is this module's, not identity dedup's (`hooks.dedup` does not
apply to it): once its run is released, the next start of the identity waits as a new run
(the next burst's), whether the released one still runs or not.

Not guaranteed: a start that comes while the due loop releases the run (within one
LUMASTRA_DUE_POLL_S of its time) is not joined: it becomes the next waiting run.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django.db import connection
from django.utils import timezone

from orchestrator.runs.publish import job_id
from orchestrator.states import LIVE_RUN_STATES
from orchestrator.stores import queries
from tasks.definition import TaskDefinition

# Marks a debounced start's run (`trigger.debounce`): the index and the join read it.
MARK = "debounce"
_LIVE_STATES = sorted(s.value for s in LIVE_RUN_STATES)


class LiveRun(NamedTuple):
    """The live run that holds a start's idempotency key."""

    id: str
    identity: str
    priority: int


def live_run_with_key(task_id: str, key: str | None) -> LiveRun | None:
    if key is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            queries.LIVE_RUN_WITH_KEY, {"task_id": task_id, "key": key, "live_states": _LIVE_STATES}
        )
        row = cursor.fetchone()
    return None if row is None else LiveRun(*row)


class Conflict:
    """A debounced start's INSERT that lost its identity to another start's waiting run: it is
    rolled back, then joins that run."""


CONFLICT = Conflict()


@dataclasses.dataclass(frozen=True)
class Joined:
    run_id: str
    job_id: str
    priority: int


def first_due(definition: TaskDefinition, due: datetime | None) -> datetime:
    """When a debounced task's new run is due: `period_s` from now, or the caller's later time."""
    assert definition.debounce is not None
    debounced = timezone.now() + timedelta(seconds=definition.debounce.period_s)
    return debounced if due is None or due < debounced else due


class Start(Protocol):
    """What a join reads of a prepared start (`runs.start.Prepared`)."""

    @property
    def definition(self) -> TaskDefinition: ...
    @property
    def identity(self) -> str: ...
    @property
    def input(self) -> dict[str, Any]: ...
    @property
    def trigger(self) -> dict[str, Any]: ...


def join(start: Start) -> Joined | None:
    """Join the waiting run of the start's identity, if any: its input (and processing version)
    replaced, its time moved; None, and nothing sent, for a start that is not debounced (a
    task without `debounce`, an operator's retry)."""
    debounce = start.definition.debounce
    if debounce is None or MARK not in start.trigger:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            queries.DEBOUNCE_RUN,
            {
                "task_id": start.definition.id,
                "identity": start.identity,
                "input": json.dumps(start.input),
                "processing_version": start.definition.processing_version,
                "period_s": debounce.period_s,
                "max_wait_s": debounce.max_wait_s,
            },
        )
        row = cursor.fetchone()
    if row is None:
        return None
    run_id, priority = row
    return Joined(run_id, job_id(start.definition.id, start.identity, run_id), priority)
