"""Each task's recent history, for operators: its newest run, and how the runs that ended in
the last day went (success rate, median and 95th-percentile duration).

Two queries whatever the number of tasks or runs (`stores/sql/task_stats.sql`,
`stores/sql/last_runs.sql`): the window is one range scan of the `finished_at` index, the
newest runs one index probe per task id. The cost of the first grows with the runs that
ended in the window, not with the table.

What counts: a run is in the window when it ended (`finished_at`) within it; the success rate
is completed / (completed + failed); cancelled runs (dropped, shed, an operator's cancel) are
counted apart and not timed. Durations are from start to end (`started_at` → `finished_at`),
so a run's time waiting in the queue is not in them, and a run retried after a transient
error is timed from its last start.

Read-only, and not at one instant with the admission figures of `hooks/overview.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection

from orchestrator.clock import SYSTEM, Clock
from orchestrator.states import RunState
from orchestrator.stores import queries

WINDOW = timedelta(days=1)


@dataclass(frozen=True)
class Ended:
    """The runs of one task that ended in the window."""

    completed: int
    failed: int
    cancelled: int
    p50: timedelta | None  # None: no run ended after starting
    p95: timedelta | None

    @property
    def success_rate(self) -> float | None:
        """Completed of completed and failed, 0 to 1; None when neither happened."""
        judged = self.completed + self.failed
        return self.completed / judged if judged else None


NOTHING_ENDED = Ended(0, 0, 0, None, None)


@dataclass(frozen=True)
class LastRun:
    run_id: str
    state: RunState
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def at(self) -> datetime:
        """When the run last moved: its end, else its start, else its creation."""
        return self.finished_at or self.started_at or self.created_at


def ended(
    task_ids: Sequence[str], *, window: timedelta = WINDOW, clock: Clock = SYSTEM
) -> dict[str, Ended]:
    """Each task's runs that ended within `window` before the clock's now, by task id (every
    id of `task_ids`, `NOTHING_ENDED` for a task with none)."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.TASK_STATS, {"since": clock.now() - window, "task_ids": list(task_ids)}
        )
        found = {
            task_id: Ended(completed, failed, cancelled, p50, p95)
            for task_id, completed, failed, cancelled, p50, p95 in cursor.fetchall()
        }
    return {task_id: found.get(task_id, NOTHING_ENDED) for task_id in task_ids}


def last_runs(task_ids: Sequence[str]) -> dict[str, LastRun]:
    """Each task's newest run by creation, whatever its state; a task that never ran is absent."""
    with connection.cursor() as cursor:
        cursor.execute(queries.LAST_RUNS, {"task_ids": list(task_ids)})
        return {
            task_id: LastRun(run_id, RunState(state), created_at, started_at, finished_at)
            for task_id, run_id, state, created_at, started_at, finished_at in cursor.fetchall()
        }
