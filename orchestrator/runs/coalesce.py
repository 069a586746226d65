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
  identity, while waiting) lets one INSERT through; the other's INSERT meets it and joins the
  winner in the same statement (`insert_or_join`, `ON CONFLICT ... DO UPDATE`), then gives back
  what its admission took. No transaction or savepoint is paid for it.

The same in Python (`start_run`), `POST /runs`, `POST /runs:batch` (a later start of the same
identity in one batch joins the earlier one) and the inbound triggers (they call `start_run`).

A debounced task's identity is this module's, not identity dedup's (`hooks.dedup` does not
apply to it): once its run is released, the next start of the identity waits as a new run
(the next burst's), whether the released one still runs or not.

Not guaranteed: a start that comes while the due loop releases the run (within one
LUMASTRA_DUE_POLL_S of its time) is not joined: it becomes the next waiting run.

`define_task(..., while_active="follow_up")` (one follow-up after the running run):
- A start that meets the live run of its identity (identity dedup's `Deduplicated`) while that
  run is running records one follow-up (`follow`, `follow_run.sql`): a new pending run that
  waits for the running one's end (`trigger.waitsFor`, `not_before` the far time `WAITS`, so
  neither the due loop, the reconciler nor a claim takes it). The start is answered
  `coalesced`, naming the follow-up. A live run that has not started yet does the start's work
  itself: the start joins it (`deduplicated`), as without the option.
- Later starts give the waiting follow-up their input (`join`, the last wins), before admission
  and without it, as a debounce's join.
- The end of the running run, in any terminal state and by any path (its worker, the drain's
  replay, the reconciler's orphan check, a kill), makes the follow-up due in the same
  transaction: the trigger `run_follow_up` on task_history (`models.runs`). The due loop
  publishes it then; identity dedup hands it the identity when the ended run settles.
- Postgres holds both, so a worker SIGKILL loses neither: the running run is put back and runs
  again, and its follow-up waits for that attempt's end. At most one follow-up waits per
  identity (the partial unique index `task_history_follow_up_one`).
- The runs of such a task take their Postgres claim at pickup (`runs.runner`), not folded into
  their end: a start must see that the run is running.

Not guaranteed: the follow-up was admitted with no admission of its own (no quota unit, no
circuit or pause check at its start: its claim still meets pauses and windows, and its pickup the
limits). A start that comes between the running run's end and its settle (or, when the end was
the reconciler's or a replay's, until the due loop releases the follow-up) may make a run of its
own beside the follow-up.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django.db import connection
from django.utils import timezone

from orchestrator.states import LIVE_RUN_STATES
from orchestrator.stores import durable, queries
from orchestrator.stores.broker import job_id
from orchestrator.triggers import TriggerKind
from tasks.definition import TaskDefinition
from tasks.policies import WhileActive

# Marks a debounced start's run (`trigger.debounce`): the index and the join read it.
MARK = "debounce"
# A waiting follow-up's mark (`trigger.waitsFor`: the run it follows up), and its `not_before`:
# far enough that nothing takes it for due.
WAITS_FOR = "waitsFor"
WAITS = datetime(9999, 12, 31, tzinfo=UTC)
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


@dataclasses.dataclass(frozen=True)
class Joined:
    run_id: str
    job_id: str
    priority: int
    followed: bool = False  # a follow-up, not a debounced run


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
    @property
    def tags(self) -> tuple[str, ...]: ...
    def row(self) -> dict[str, Any]: ...


def join(start: Start) -> Joined | None:
    """Join the waiting run of the start's identity, if any: a debounced task's (its time
    moved) or a follow-up task's; its input (and processing version) replaced. None, and
    nothing sent, for a start that coalesces neither way (an operator's retry does not)."""
    definition = start.definition
    debounce = definition.debounce
    params: dict[str, str | int | list[str]] = {
        "task_id": definition.id,
        "identity": start.identity,
        "input": json.dumps(start.input),
        "processing_version": definition.processing_version,
        "tags": list(start.tags),
    }
    query: queries.Prepared | str
    if debounce is not None and MARK in start.trigger:
        query = queries.DEBOUNCE_RUN
        params |= {"period_s": debounce.period_s, "max_wait_s": debounce.max_wait_s}
    elif follows_up(start):
        query = queries.JOIN_FOLLOW_UP
    else:
        return None
    with connection.cursor() as cursor:
        durable.send(cursor, query, params)
        row = cursor.fetchone()
    return None if row is None else _joined(start, row, followed=query is queries.JOIN_FOLLOW_UP)


def insert_or_join(start: Start) -> Joined | None:
    """A debounced start's run inserted (None), or, when a concurrent first start's waiting run
    won the identity meanwhile, that run given this start's input and time (`insert_debounced.sql`:
    one statement, no savepoint or transaction of its own)."""
    debounce = start.definition.debounce
    assert debounce is not None
    params = {**start.row(), "period_s": debounce.period_s, "max_wait_s": debounce.max_wait_s}
    with connection.cursor() as cursor:
        durable.send(cursor, queries.INSERT_DEBOUNCED, params)
        run_id, priority, inserted = cursor.fetchone()
    return None if inserted else _joined(start, (run_id, priority), followed=False)


def follows_up(start: Start) -> bool:
    """Whether the start coalesces with its identity's running run: a follow-up task's, not an
    operator's retry (which is a run of its own, linked to the run it retries)."""
    return (
        start.definition.while_active is WhileActive.FOLLOW_UP
        and start.trigger.get("kind") != TriggerKind.OPERATOR_RETRY.value
    )


def follow(start: Start, holder: str) -> Joined | None:
    """The follow-up of `holder`, the live run of the start's identity, recorded or given this
    start's input; None when the start does not follow up, or when the holder has not started
    (the start joins it)."""
    if not follows_up(start):
        return None
    with connection.cursor() as cursor:
        cursor.execute(queries.FOLLOW_RUN, {**start.row(), "holder": holder, "waits": WAITS})
        row = cursor.fetchone()
    return None if row is None else _joined(start, row, followed=True)


def _joined(start: Start, row: tuple[str, int], *, followed: bool) -> Joined:
    run_id, priority = row
    job = job_id(start.definition.id, start.identity, run_id)
    return Joined(run_id, job, priority, followed)
