"""The overview's figures of what ended: runs completed and failed per minute over the last
hour, per day over the last 30 days, and the tasks that failed most in the last day.

- Per minute: `sql/ends_per_minute.sql`, one range scan of the `finished_at` index; its cost
  grows with the runs that ended in the hour, not with the table.
- Per day: the daily counts the engine keeps anyway for quotas (`hooks.quotas`: a task's
  completed and failed ends per UTC day, in `task_quota_usage` and, not yet rolled up, in
  Valkey), so 30 days cost one query over (tasks by days) rows, never a scan of the history;
  the recent days the rollup may not have copied yet are read by `quotas.usage`, as the Tasks
  page reads today.
- Top failing: the Tasks page's last-day statistics (`stats.ended`), the tasks with the most
  failed runs first.

What counts: a run's final end, completed or failed, in the minute or UTC day it ended (an
attempt that failed and was retried is no end; cancelled runs are not counted). Not
guaranteed: a day's counts carry the quotas' own limits (a Valkey that lost its data
undercounts that day; days the rollup missed for longer than `quotas.COUNT_TTL` are lost), and
runs the retention deleted are gone from the minutes (an hour is far inside any retention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.db import connection
from django.db.models import Sum

from orchestrator import sql
from orchestrator.admin import stats
from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks import quotas
from orchestrator.models import TaskQuotaUsage
from tasks.definition import TaskDefinition

ENDS_PER_MINUTE = sql.load(__file__, "ends_per_minute")
MINUTES = 60
DAYS = 30
TOP_FAILING = 5


@dataclass(frozen=True)
class Bar:
    """The runs that ended in one minute or one UTC day, which begins `at` (UTC)."""

    at: datetime
    completed: int
    failed: int


@dataclass(frozen=True)
class Failing:
    task_id: str
    ended: stats.Ended


def per_minute(*, minutes: int = MINUTES, clock: Clock = SYSTEM) -> list[Bar]:
    """One bar per minute, oldest first, the last being the minute now is in (still filling)."""
    current = clock.now().astimezone(UTC).replace(second=0, microsecond=0)
    first = current - timedelta(minutes=minutes - 1)
    with connection.cursor() as cursor:
        cursor.execute(ENDS_PER_MINUTE, {"since": first})
        found = {minute.astimezone(UTC): (c, f) for minute, c, f in cursor.fetchall()}
    return [
        Bar(at, *found.get(at, (0, 0)))
        for at in (first + timedelta(minutes=n) for n in range(minutes))
    ]


def per_day(
    definitions: Sequence[TaskDefinition], *, days: int = DAYS, clock: Clock = SYSTEM
) -> list[Bar]:
    """One bar per UTC day of the registered tasks' ends, oldest first, the last being today."""
    today = clock.now().astimezone(UTC).date()
    first = today - timedelta(days=days - 1)
    # Days the rollup may not have copied from Valkey yet: read as the quota hook reads a day.
    recent = [today - timedelta(days=back) for back in range(min(days, quotas.COUNT_TTL.days))]
    rolled = (
        TaskQuotaUsage.objects.filter(
            task_id__in=[d.id for d in definitions], day__gte=first, day__lt=min(recent)
        )
        .values_list("day")
        .order_by()
        .annotate(completed=Sum("completed"), failed=Sum("failed"))
    )
    counts: dict[date, tuple[int, int]] = {day: (c, f) for day, c, f in rolled}
    for day in recent:
        usage = quotas.usage(definitions, day).values()
        counts[day] = (sum(u.completed for u in usage), sum(u.failed for u in usage))
    return [
        Bar(datetime.combine(day, time(), UTC), *counts.get(day, (0, 0)))
        for day in (first + timedelta(days=n) for n in range(days))
    ]


def top_failing(
    task_ids: Sequence[str], *, top: int = TOP_FAILING, clock: Clock = SYSTEM
) -> list[Failing]:
    """The tasks with failed runs in the last day, the most failed first (then by id), at most
    `top` of them."""
    ended = stats.ended(task_ids, clock=clock)
    failing = sorted(
        (Failing(task_id, e) for task_id, e in ended.items() if e.failed),
        key=lambda f: (-f.ended.failed, f.task_id),
    )
    return failing[:top]
