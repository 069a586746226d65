"""Switching a schedule on or off: the one path the admin's Schedules page takes.

- A static schedule is a django-celery-beat `PeriodicTask` row. Its `enabled` field is the
  operator's (`scheduler.sync` never turns back on a row an operator turned off); the row is
  saved through its model, which tells beat of the change (django-celery-beat's change
  marker), so beat stops or starts firing it at its next check of the rows. A row the sync
  manages whose task no longer declares a static schedule is not switched on: it would fire a
  task that is gone.
- A row of a dynamic schedule is switched in `scheduler_state.disabled`; the scheduler tick
  skips it while off and fires it at the next tick when switched on, if its current slot has
  not fired (`scheduler.dynamic`).

Not guaranteed: a fire already under way when a schedule is switched off still starts its
run (beat's message in flight, or a tick that read the row just before).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.functions import Now
from django_celery_beat.models import PeriodicTask

from orchestrator.models import SchedulerState
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from orchestrator.scheduler.sync import static_definitions
from tasks import registry
from tasks.schedule import Dynamic

log = logging.getLogger(__name__)

_ROW_KEY_LENGTH = 180  # scheduler_state.row_key
# How `scheduler.policies` begins the reason a schedule paused itself.
PAUSED_PREFIX = "switched off:"


class UnknownSchedule(LookupError):
    """No such beat row, or no such dynamic schedule."""


class CannotEnable(ValueError):
    """The beat row fires a task that no longer declares a static schedule."""


def switch_static(name: str, *, enabled: bool, actor: str) -> bool:
    """Switch the beat row `name` on or off; False when it already was."""
    with transaction.atomic():
        row = PeriodicTask.objects.select_for_update().filter(name=name).first()
        if row is None:
            raise UnknownSchedule(f"no beat schedule named {name!r}")
        if row.enabled == enabled:
            return False
        if (
            enabled
            and row.task == DISPATCH_TASK
            and name not in {d.id for d in static_definitions()}
        ):
            raise CannotEnable(
                f"task {name!r} no longer declares a static schedule; the row stays off"
            )
        row.enabled = enabled
        row.save()  # not update(): the model's save tells beat the rows changed
        # The operator decides from now on: the sync must not turn it back on by itself.
        SchedulerState.objects.filter(key=state_key(name), sync_disabled=True).update(
            sync_disabled=False
        )
        if enabled:
            # `pause_on_failure` counts from here; the reason it paused is history.
            state = SchedulerState.objects.filter(key=state_key(name))
            state.update(failures_since=Now())
            state.filter(last_error__startswith=PAUSED_PREFIX).update(last_error="")
    log.info("schedule %s switched %s by %s", name, "on" if enabled else "off", actor)
    return True


def switch_dynamic(task_id: str, row_key: str, *, enabled: bool, actor: str) -> bool:
    """Switch one row of a dynamic schedule on or off; False when it already was."""
    check_dynamic(task_id, row_key)
    key = state_key(task_id, row_key)
    with transaction.atomic():
        current = (
            SchedulerState.objects.select_for_update()
            .filter(key=key)
            .values_list("disabled", flat=True)
            .first()
        )
        if bool(current) == (not enabled):
            return False  # no state yet reads as on: a row never switched off
        # An upsert: the tick may create the row's state (its first fire) at the same time.
        SchedulerState.objects.bulk_create(
            [SchedulerState(key=key, task_id=task_id, row_key=row_key, disabled=not enabled)],
            update_conflicts=True,
            unique_fields=["key"],
            update_fields=["disabled", "updated_at"],
        )
    log.info("schedule %s switched %s by %s", key, "on" if enabled else "off", actor)
    return True


def check_dynamic(task_id: str, row_key: str) -> None:
    """UnknownSchedule unless `task_id` has a dynamic schedule and `row_key` can be a row's."""
    definition = registry.get().get(task_id)
    if definition is None or not isinstance(definition.schedule, Dynamic):
        raise UnknownSchedule(f"task {task_id!r} has no dynamic schedule")
    if not row_key or len(row_key) > _ROW_KEY_LENGTH:
        raise UnknownSchedule(f"{row_key!r} is not a row key of {task_id!r}")
