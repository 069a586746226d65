"""A static schedule's policies beyond firing (issue 38; declared by `every()` and `cron()`,
`tasks.schedule.Policies`):

- `pause_on_failure=N`: once the schedule's last N runs that ended (trigger kind `schedule`,
  since its beat row last changed: an operator switching it back on starts the count again)
  all failed, the scheduler tick switches the row off through the operator's own path
  (`switch.switch_static`, actor `pause_on_failure`), writes the reason where the Schedules
  page shows a schedule's last error (`scheduler_state.last_error`), logs it, and counts it
  (`lumastra_schedule_paused_total{task}`). A cancelled run or a success breaks the row.
- `catch_up_within_s`: read by the boot catch-up (`scheduler.catchup`).
- `jitter_s` (`jitter_of`: the operator's, else the definition's; a dynamic row has only an
  operator's): a slot is fired `orchestrator.slots.jitter` seconds after it begins, by the
  scheduler tick (`scheduler.dynamic`); beat's message at the slot's start fires nothing
  (`Outcome.EARLY`). While the loops are down a jittered static slot waits for the boot
  catch-up.

Costs one query per tick for each enabled schedule that declares `pause_on_failure` (the
task's latest ended scheduled runs, on the task's history index), none for the others.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db.models.fields.json import KT
from django_celery_beat.models import PeriodicTask

from orchestrator.models import ScheduleOverride, SchedulerState, TaskHistory
from orchestrator.scheduler.names import state_key
from orchestrator.scheduler.switch import switch_static
from orchestrator.states import TERMINAL_RUN_STATES, RunState
from orchestrator.stores import counters
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.schedule import Cron, Every, Policies

log = logging.getLogger(__name__)

ACTOR = "pause_on_failure"


def of(task_id: str) -> Policies:
    """The policies of `task_id`'s static schedule (none declared: the defaults)."""
    definition = registry.get().get(task_id)
    schedule = definition.schedule if definition is not None else None
    return schedule.policies if isinstance(schedule, Every | Cron) else Policies()


def jitter_of(task_id: str, override: ScheduleOverride | None) -> int:
    """The jitter a schedule fires with: its override's, else its definition's."""
    if override is not None and override.jitter_s is not None:
        return override.jitter_s
    return of(task_id).jitter_s


def pause_failing(rows: Iterable[PeriodicTask]) -> list[str]:
    """Switch off each of the enabled synced `rows` whose last `pause_on_failure` ended
    scheduled runs all failed; returns their names."""
    paused = []
    for row in rows:
        limit = of(row.name).pause_on_failure
        if limit is None:
            continue
        ended = list(
            TaskHistory.objects.alias(kind=KT("trigger__kind"))
            .filter(
                task_id=row.name,
                kind=TriggerKind.SCHEDULE.value,
                state__in=[s.value for s in TERMINAL_RUN_STATES],
                created_at__gte=row.date_changed,
            )
            .order_by("-created_at")
            .values_list("state", flat=True)[:limit]
        )
        if len(ended) < limit or any(state != RunState.FAILED for state in ended):
            continue
        reason = f"switched off: its last {limit} runs failed in a row (pause_on_failure)"
        if switch_static(row.name, enabled=False, actor=ACTOR):
            SchedulerState.objects.update_or_create(
                key=state_key(row.name), defaults={"task_id": row.name, "last_error": reason}
            )
            counters.add(counters.SCHEDULE_PAUSES, (row.name,))
            log.warning("schedule %s %s", row.name, reason)
            paused.append(row.name)
    return paused
