"""Daily quotas: counts each task's admitted, completed and failed runs per UTC day, and
refuses starts past `quotas.max_runs_per_day`.

Two ways of counting, by whether the task has a cap:

- **Capped** (`max_runs_per_day` set): exact, in Postgres. The admit counter is taken inside
  start_run's transaction by one conditional upsert of the `(task, day)` row of
  `task_quota_usage`, so a start whose caller rolls back gives its unit back; a start refused,
  dropped or deduplicated after the unit was taken gives it back through `abandoned`.
- **Uncapped**: nothing to enforce, so no Postgres write per start or end (no round trip, no
  WAL flush, no hot row every start of the task queues on). The counts go to a Valkey hash per
  task and day (`keys.quota_counts`, kept COUNT_TTL), counted by the start's admission script
  (`live.queue_admission`, in the admission hooks' pipeline) and by the end's own script
  (`live.EndCount`), so this hook takes part in no point of an uncapped task's runs.
  `rollup` copies them into `task_quota_usage` (`orchestrator.loops`, on the cluster leader,
  every LUMASTRA_QUOTA_ROLLUP_INTERVAL_S): it writes the Valkey counts as absolute values and never
  lowers a count, so rolling up twice, or a late tick of a leader that lost its seat, changes
  nothing. `usage` reads both, so the API, the admin and the overview show today's counts
  without the rollup's lag; only readers of the table itself see them up to one interval late.

Counts are per UTC day; a run admitted just before midnight that finishes after it counts as
started on one day and finished on the next.

Not guaranteed, for uncapped tasks:
- A caller's transaction that rolls back after its start was admitted keeps its `started`
  count (Valkey is not part of the transaction). Refused, dropped and deduplicated starts
  give theirs back (`live.give_back_start`).
- A Valkey that lost its data (restarted without persistence, flushed) loses the counts
  since the last rollup, and counts that day again from zero: the row keeps the larger of
  what it had and the new count, so that day is undercounted.
- The day a deploy gives a task a cap, its exact count starts from the last rollup (runs
  since then are not in it); the day a cap is removed, the row shows the larger of the capped
  count and the new Valkey count, not their sum. Hashes of tasks no longer in the registry
  are not rolled up.
- Days older than COUNT_TTL are not rolled up (their hashes expired): a loops process down
  that long loses them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Protocol

from django.db import connection

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks.base import Admission, Outcome, Part, Refused, RunHook
from orchestrator.models import TaskQuotaUsage
from orchestrator.states import RunState
from orchestrator.stores import keys, queries, valkey
from orchestrator.stores.live import QUOTA_COUNT_TTL
from tasks import registry
from tasks.definition import TaskDefinition

log = logging.getLogger(__name__)

COUNT_TTL = QUOTA_COUNT_TTL
FIELDS = ("started", "completed", "failed")


class QuotaExceeded(Refused):
    code = "quota_exceeded"
    http_status = 429


class Fence(Protocol):
    """The cluster seat the rollup writes under (`orchestrator.cluster.locks.Fence`)."""

    def check(self) -> None: ...


@dataclass(frozen=True)
class Counts:
    started: int = 0
    completed: int = 0
    failed: int = 0


@dataclass
class DailyQuota(RunHook):
    name: str = "quota"
    clock: Clock = SYSTEM

    def takes_part(self, point: str, definition: TaskDefinition) -> bool:
        # An uncapped task's day is counted by the start's and the end's own scripts
        # (`live.queue_admission`, `live.EndCount`): the hook has nothing to do for it.
        return definition.quotas.capped

    def plan_admit(self, admission: Admission) -> Part:
        # The exact check reads Postgres after the hooks before it answered (the circuit
        # refuses before a unit is taken).
        return Part(lambda replies: self._take(admission), after_replies=True)

    def _take(self, admission: Admission) -> None:
        cap = admission.definition.quotas.max_runs_per_day
        now = self.clock.now()
        with connection.cursor() as cursor:
            cursor.execute(
                queries.QUOTA_TAKE,
                {"task_id": admission.definition.id, "day": now.date(), "cap": cap},
            )
            taken = cursor.fetchone()
        if taken is None:
            midnight = datetime.combine(now.date() + timedelta(days=1), time(), now.tzinfo)
            raise QuotaExceeded(
                f"task {admission.definition.id!r} reached its quota of {cap} runs today "
                f"(UTC); it resets at {midnight.isoformat()}",
                retry_after=midnight - now,
            )

    def abandoned(self, admission: Admission) -> None:
        day = self.clock.now().date()
        # The unit goes back explicitly rather than through a savepoint around admission:
        # savepoints cost start_run two round trips on every start. A transaction already
        # doomed to roll back gives it back by itself (and would refuse the UPDATE).
        if connection.needs_rollback:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                queries.QUOTA_GIVE_BACK, {"task_id": admission.definition.id, "day": day}
            )

    def plan_finished(self, outcome: Outcome) -> Part | None:
        if not outcome.final or outcome.state not in (RunState.COMPLETED, RunState.FAILED):
            return None
        definition = outcome.definition
        day = self.clock.now().date()
        completed = outcome.state == RunState.COMPLETED
        return Part(lambda replies: _count_end(definition.id, day, completed))


def _count_end(task_id: str, day: date, completed: bool) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            queries.QUOTA_COUNT_END,
            {
                "task_id": task_id,
                "day": day,
                "completed": int(completed),
                "failed": int(not completed),
            },
        )


def day_hashes(
    key: Callable[[str, str], str], task_ids: Sequence[str], clock: Clock
) -> Iterator[tuple[str, date, dict[str, str]]]:
    """(task, day, hash) for every task and each of the last COUNT_TTL days (UTC), in one
    Valkey pipeline: what a rollup copies into task_quota_usage."""
    today = clock.now().date()
    days = [today - timedelta(days=back) for back in range(COUNT_TTL.days)]
    pipe = valkey.client().pipeline(transaction=False)
    for task_id in task_ids:
        for day in days:
            pipe.hgetall(key(task_id, day.isoformat()))
    found = iter(valkey.execute(pipe))
    for task_id in task_ids:
        for day in days:
            yield task_id, day, next(found)


def rollup(*, fence: Fence | None = None, clock: Clock = SYSTEM) -> int:
    """Copy uncapped tasks' Valkey counts of the last COUNT_TTL days into task_quota_usage
    (see the module docstring); one Valkey pipeline and at most one statement. Returns how
    many rows changed."""
    tasks = sorted(task_id for task_id, d in registry.get().items() if not d.quotas.capped)
    rows = [
        (task_id, day, counts)
        for task_id, day, found in day_hashes(keys.quota_counts, tasks, clock)
        if (counts := _counts(found)) != Counts()
    ]
    if not rows:
        return 0
    if fence is not None:
        fence.check()
    with connection.cursor() as cursor:
        cursor.execute(
            queries.QUOTA_ROLLUP,
            {
                "task_ids": [task_id for task_id, _, _ in rows],
                "days": [day for _, day, _ in rows],
                "started": [c.started for _, _, c in rows],
                "completed": [c.completed for _, _, c in rows],
                "failed": [c.failed for _, _, c in rows],
            },
        )
        changed: int = cursor.rowcount
    if changed:
        log.info("quota rollup: %d task-day rows updated from Valkey", changed)
    return changed


def usage(definitions: Sequence[TaskDefinition], day: date) -> dict[str, Counts]:
    """Each task's counts of `day`: the row, and for uncapped tasks the Valkey counts not yet
    rolled up (the larger of the two, as the rollup will write them). One query and one
    Valkey pipeline."""
    ids = [definition.id for definition in definitions]
    rows = {
        row.task_id: Counts(row.started, row.completed, row.failed)
        for row in TaskQuotaUsage.objects.filter(task_id__in=ids, day=day)
    }
    uncapped = [definition.id for definition in definitions if not definition.quotas.capped]
    live: dict[str, Counts] = {}
    if uncapped:
        pipe = valkey.client().pipeline(transaction=False)
        for task_id in uncapped:
            pipe.hgetall(keys.quota_counts(task_id, day.isoformat()))
        live = dict(zip(uncapped, map(_counts, valkey.execute(pipe)), strict=True))
    return {task_id: _larger(rows.get(task_id), live.get(task_id)) for task_id in ids}


def _counts(found: dict[str, str]) -> Counts:
    # Never below zero: a give-back whose count Valkey had already lost.
    return Counts(*(max(0, int(found.get(field) or 0)) for field in FIELDS))


def _larger(*sources: Counts | None) -> Counts:
    present: Iterable[Counts] = [counts for counts in sources if counts is not None]
    return Counts(*(max((getattr(c, field) for c in present), default=0) for field in FIELDS))
