"""A static schedule's policies beyond firing (issue 38; declared by `every()` and `cron()`,
`tasks.schedule.Policies`):

- `pause_on_failure=N`: once the schedule's last N runs that ended (trigger kind `schedule`,
  created since it was last switched on: `scheduler_state.failures_since`) all failed, the
  scheduler tick switches the row off through the operator's own path (`switch.switch_static`,
  actor `pause_on_failure`), writes the reason where the Schedules page shows a schedule's last
  error (`scheduler_state.last_error`), logs it, and counts it
  (`lumastra_schedule_paused_total{task}`). A cancelled run or a success breaks the row.
- `catch_up_within_s`: read by the boot catch-up (`scheduler.catchup`).
- `jitter_s` (`jitter_of`: the operator's, else the definition's; a dynamic row has only an
  operator's): a slot is fired `fire_delay` seconds after it begins (`orchestrator.slots.
  jitter`, kept short of the next fire by the tick's on-time window, so a long jitter on a
  short cadence still fires every slot), by the scheduler tick (`scheduler.dynamic`), which
  fires a jittered slot whenever its delay is over and it is not claimed (within
  `catch_up_within_s`, if declared): beat's message at the slot's start fires nothing
  (`Outcome.DECLINED`).

Costs two queries per tick for each enabled schedule that declares `pause_on_failure` (its
count's start, and the task's latest ended scheduled runs), none for the others.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.db.models.fields.json import KT
from django_celery_beat.models import PeriodicTask

from orchestrator.clock import EPOCH
from orchestrator.models import NotificationKind, ScheduleOverride, SchedulerState, TaskHistory
from orchestrator.notifications import events
from orchestrator.scheduler.names import state_key
from orchestrator.scheduler.switch import PAUSED_PREFIX, switch_static
from orchestrator.slots import Slots, jitter
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


# The tick fires a slot at most this long after it is due (three ticks, if longer): an older
# unjittered slot is beat's and the boot catch-up's.
ON_TIME_S = 30


def on_time_s() -> int:
    return max(ON_TIME_S, 3 * settings.CONFIG.scheduler_tick_s)


def fire_delay(slots: Slots, key: str, slot: int, jitter_s: int) -> int:
    """Seconds into `slot` schedule `key` fires it: its jitter, with no more room than leaves
    the tick its on-time window before the next fire."""
    if jitter_s <= 0:
        return 0
    following = slots.fires(datetime.fromtimestamp(slot, UTC), 1)
    room = int(following[0].timestamp()) - slot - on_time_s() if following else jitter_s
    return jitter(key, slot, max(0, min(jitter_s, room)))


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
        since = (
            SchedulerState.objects.filter(key=state_key(row.name))
            .values_list("failures_since", flat=True)
            .first()
        )
        ended = list(
            TaskHistory.objects.alias(kind=KT("trigger__kind"))
            .filter(
                task_id=row.name,
                kind=TriggerKind.SCHEDULE.value,
                state__in=[s.value for s in TERMINAL_RUN_STATES],
            )
            .filter(created_at__gte=since or EPOCH)
            .order_by("-created_at")
            .values_list("state", flat=True)[:limit]
        )
        if len(ended) < limit or any(state != RunState.FAILED for state in ended):
            continue
        reason = f"{PAUSED_PREFIX} its last {limit} runs failed in a row (pause_on_failure)"
        # The switch, its reason and its notification stand or fall together: a schedule
        # switched off is not looked at again.
        with transaction.atomic():
            if not switch_static(row.name, enabled=False, actor=ACTOR):
                continue
            SchedulerState.objects.update_or_create(
                key=state_key(row.name), defaults={"task_id": row.name, "last_error": reason}
            )
            events.notify(
                NotificationKind.SCHEDULE_PAUSED,
                subject=row.name,
                title=f"Schedule switched off: {row.name}",
                body=f"The schedule {row.name} {reason}. Switch it on again once it is fixed.",
                link="/admin/orchestrator/taskhistory/schedules/",
            )
        counters.add(counters.SCHEDULE_PAUSES, (row.name,))
        log.warning("schedule %s %s", row.name, reason)
        paused.append(row.name)
    return paused
