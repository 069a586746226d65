"""Cost tracking and cost quotas: what each task spends per UTC day, and the caps on it.

`ctx.spend(kind, units)` adds to the task's spend of the day at once, in a Valkey hash per
task and day (`keys.cost_day`, kept COUNT_TTL like the run counts), whichever attempt or
stage it comes from and whether or not the run succeeds: money spent is spent. The run's own
`cost_breakdown` and its step records get the same units at the step's end
(`orchestrator/runs/steps.py`).

- **Cost quotas**: a task with `Quotas(max_cost_per_day={"openai_tokens": 2_000_000})` is
  refused at admission (429, `cost_quota_exceeded`, Retry-After until the next UTC midnight)
  once the day's spend of any capped kind has reached its cap. The check reads the day's hash
  in the admission pipeline (no extra round trip); the hook applies only to tasks with caps
  (`applies`), so the runs of others never call it. The
  cap is checked at start, not at each `spend`: a run already running may take the day past
  its cap.
- **Rollup**: `rollup` copies the hashes into `task_quota_usage.cost` (per task and day) on
  the cluster leader, beside the run counts' rollup, as absolute values that are never
  lowered kind by kind; `spent` reads the hashes, so the tasks API and admin show today's
  spend without the rollup's lag.

Not guaranteed: a Valkey that lost its data loses the spend since the last rollup (the cap
then counts from the rolled-up figure, which `spent` also reads); days older than COUNT_TTL
are not rolled up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db import connection

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks.base import Admission, Part, Refused, RunHook, checked
from orchestrator.hooks.quotas import COUNT_TTL, Fence, day_hashes
from orchestrator.models import TaskQuotaUsage
from orchestrator.stores import counters, keys, queries, valkey
from tasks import registry
from tasks.definition import TaskDefinition

log = logging.getLogger(__name__)


class CostQuotaExceeded(Refused):
    code = "cost_quota_exceeded"
    http_status = 429


def record(task_id: str, kind: str, units: float, clock: Clock = SYSTEM) -> None:
    key = keys.cost_day(task_id, clock.now().date().isoformat())
    pipe = valkey.client().pipeline(transaction=False)
    pipe.hincrbyfloat(key, kind, units)
    pipe.expire(key, COUNT_TTL)
    counters.add(counters.COST, (task_id, kind), float(units), pipe)
    valkey.execute(pipe)


def _as_costs(found: dict[str, str] | None) -> dict[str, float]:
    return {kind: float(units) for kind, units in (found or {}).items()}


@dataclass
class CostQuota(RunHook):
    name: str = "cost-quota"
    clock: Clock = SYSTEM

    def applies(self, definition: TaskDefinition) -> bool:
        return bool(definition.quotas.max_cost_per_day)

    def plan_admit(self, admission: Admission) -> Part | None:
        caps = admission.definition.quotas.max_cost_per_day
        if not caps:
            return None
        now = self.clock.now()
        key = keys.cost_day(admission.definition.id, now.date().isoformat())

        def decide(replies: list[Any]) -> None:
            (found,) = checked(replies)
            spent = _larger(_as_costs(found), _rolled_up(admission.definition.id, now.date()))
            over = sorted(kind for kind, cap in caps.items() if spent.get(kind, 0) >= cap)
            if over:
                midnight = datetime.combine(now.date() + timedelta(days=1), time(), now.tzinfo)
                shown = ", ".join(f"{kind} {spent[kind]:g} of {caps[kind]:g}" for kind in over)
                raise CostQuotaExceeded(
                    f"task {admission.definition.id!r} reached its daily cost quota ({shown}, "
                    f"UTC); it resets at {midnight.isoformat()}",
                    retry_after=midnight - now,
                )

        return Part(decide, lambda pipe: pipe.hgetall(key))


def _rolled_up(task_id: str, day: date) -> dict[str, float] | None:
    """The table's figure, for a Valkey that lost the day's hash after a rollup. Read only when
    the hash is below a cap, so a capped start pays it; uncapped tasks never do."""
    with connection.cursor() as cursor:
        cursor.execute(queries.COST_ROLLED_UP, {"task_id": task_id, "day": day})
        found = cursor.fetchone()
    if found is None:
        return None
    return _as_costs(json.loads(found[0]) if isinstance(found[0], str) else found[0])


def _larger(*sources: dict[str, float] | None) -> dict[str, float]:
    merged: dict[str, float] = {}
    for source in sources:
        for kind, units in (source or {}).items():
            merged[kind] = max(merged.get(kind, 0.0), units)
    return merged


def spent(task_ids: Sequence[str], day: date) -> dict[str, dict[str, float]]:
    """What each task spent on `day` (UTC), by kind: the larger of Valkey's and the table's
    figures. One Valkey pipeline and one query for all of them."""
    pipe = valkey.client().pipeline(transaction=False)
    for task_id in task_ids:
        pipe.hgetall(keys.cost_day(task_id, day.isoformat()))
    found = valkey.execute(pipe)
    rolled = {
        row.task_id: _as_costs(row.cost)
        for row in TaskQuotaUsage.objects.filter(task_id__in=task_ids, day=day).only("cost")
    }
    return {
        task_id: _larger(_as_costs(hash_), rolled.get(task_id))
        for task_id, hash_ in zip(task_ids, found, strict=True)
    }


def rollup(*, fence: Fence | None = None, clock: Clock = SYSTEM) -> int:
    """Copy the last COUNT_TTL days' spend into task_quota_usage.cost; returns rows changed."""
    rows = [
        (task_id, day, costs)
        for task_id, day, found in day_hashes(keys.cost_day, sorted(registry.get()), clock)
        if (costs := _as_costs(found))
    ]
    if not rows:
        return 0
    if fence is not None:
        fence.check()
    changed = 0
    with connection.cursor() as cursor:
        for task_id, day, costs in rows:
            cursor.execute(
                queries.COST_ROLLUP, {"task_id": task_id, "day": day, "cost": json.dumps(costs)}
            )
            changed += cursor.rowcount
    if changed:
        log.info("cost rollup: %d task-day rows updated from Valkey", changed)
    return changed
