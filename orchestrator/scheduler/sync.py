"""Static schedules → django-celery-beat rows: `manage.py sync_schedules`.

Every task whose definition declares `schedule=every(...)` or a cron expression gets one
`PeriodicTask` row named after the task id, calling `lumastra.schedule.dispatch` with args
`[task_id]` on the queue `task.scheduler` (every pool of the worker role consumes it). A cron
row carries its zone (`cron(..., tz=...)`, else LUMASTRA_TIME_ZONE): it is what the slots
are read in (`orchestrator.slots`).
`make run` runs the sync before starting the roles, and the beat role runs it before beat
starts (deploy/Procfile), so beat never starts on rows older than the code it ships with.

The sync is idempotent: a second run changes nothing. It writes in one transaction, after
every schedule resolved, so a bad override leaves the rows as they were.

`every('15m', env_override='SYNC_MY_TASK_INTERVAL')`: when that variable is set, its value
(an interval such as `90s`, `15m`, `6h`, `1d`) replaces the declared interval; a value that
is not one stops the sync with a `ScheduleConfigError` naming the variable and the task.

Who wins when an operator edits a synced row in the admin:
- the definition owns the cadence and the target: interval or crontab, task, args, kwargs,
  queue are put back on every sync (to change a cadence, change the definition or set its
  `env_override` variable);
- the operator owns `enabled`: the sync never re-enables a row an operator disabled. It
  enables a row only when creating it, or when it disabled the row itself because the
  definition went away and the definition is back (`scheduler_state.sync_disabled`);
- rows that do not call the dispatch task (an operator's own beat entries) are not touched.

A managed row whose task no longer declares a static schedule (the task was removed, or its
schedule was, or it became dynamic) is disabled, not deleted: its history and last run stay
visible in the admin.

Not guaranteed: beat reads the rows when it starts and when django-celery-beat notices a
change; a sync made while beat runs takes effect at beat's next check (its `sync_every`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from orchestrator.models import ScheduleOverride, SchedulerState
from orchestrator.scheduler.names import DISPATCH_TASK, SCHEDULER_QUEUE, state_key
from orchestrator.slots import CronSlots, IntervalSlots, Slots, cadence
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.schedule import Cron, Every, parse_interval

log = logging.getLogger(__name__)

DESCRIPTION = "synced from the definition of task {task_id!r} by manage.py sync_schedules"
_PERIODS = (
    (86_400, "days"),
    (3_600, "hours"),
    (60, "minutes"),
    (1, "seconds"),
)


class ScheduleConfigError(ValueError):
    """A schedule's override variable holds a value that is not an interval."""


def resolve(definition: TaskDefinition, environ: Mapping[str, str]) -> Slots:
    """The static schedule a definition runs on, its env_override applied."""
    schedule = definition.schedule
    if isinstance(schedule, Cron):
        return CronSlots(schedule.expression, schedule.tz or settings.CONFIG.time_zone)
    if not isinstance(schedule, Every):
        raise TypeError(f"task {definition.id!r} has no static schedule")
    variable = schedule.env_override
    if variable is not None and variable in environ:
        raw = environ[variable]
        try:
            return IntervalSlots(parse_interval(raw))
        except ValueError as exc:
            raise ScheduleConfigError(
                f"{variable}={raw!r} (the schedule of task {definition.id!r}): {exc}"
            ) from None
    return IntervalSlots(schedule.interval)


def lock_cadences() -> None:
    """In the caller's transaction: one writer of the synced rows' cadences at a time, the sync
    or an operator's override (`scheduler.overrides`), so neither writes over the other."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('lumastra.schedule.cadences'))")


def overridden(override: ScheduleOverride) -> Slots:
    """The schedule an operator's override gives (its zone: its own, else LUMASTRA_TIME_ZONE)."""
    return cadence(override.cron, override.every_s, override.tz or settings.CONFIG.time_zone)


def static_definitions(definitions: Iterable[TaskDefinition] | None = None) -> list[TaskDefinition]:
    source = registry.get().values() if definitions is None else definitions
    return [d for d in source if isinstance(d.schedule, Every | Cron)]


def slots_of(row: PeriodicTask) -> Slots | None:
    """The schedule a synced row runs on, as beat sees it (None: neither interval nor cron)."""
    if row.interval is not None:
        seconds = (
            int(row.interval.every)
            * {
                "days": 86_400,
                "hours": 3_600,
                "minutes": 60,
                "seconds": 1,
                "microseconds": 0,
            }[row.interval.period]
        )
        return IntervalSlots(timedelta(seconds=seconds)) if seconds >= 1 else None
    if row.crontab is not None:
        c = row.crontab
        expression = f"{c.minute} {c.hour} {c.day_of_month} {c.month_of_year} {c.day_of_week}"
        return CronSlots(expression, str(c.timezone))
    return None


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    enabled_again: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{len(self.created)} created",
            f"{len(self.updated)} updated",
            f"{len(self.enabled_again)} enabled again",
            f"{len(self.disabled)} disabled",
            f"{len(self.unchanged)} unchanged",
        ]
        return ", ".join(parts)


def schedule_fields(slots: Slots) -> dict[str, Any]:
    if isinstance(slots, IntervalSlots):
        seconds = int(slots.interval.total_seconds())
        every, period = next((seconds // s, p) for s, p in _PERIODS if seconds % s == 0)
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period=period)
        return {"interval": interval, "crontab": None}
    minute, hour, day_of_month, month_of_year, day_of_week = slots.expression.split()
    crontab, _ = CrontabSchedule.objects.get_or_create(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
        timezone=slots.tz,
    )
    return {"interval": None, "crontab": crontab}


def sync(
    definitions: Iterable[TaskDefinition] | None = None,
    environ: Mapping[str, str] | None = None,
) -> SyncReport:
    """Make the PeriodicTask rows match the static schedules (see the module doc)."""
    env = os.environ if environ is None else environ
    wanted = {d.id: resolve(d, env) for d in static_definitions(definitions)}
    report = SyncReport()
    with transaction.atomic():
        lock_cadences()
        # An operator's cadence outlives the sync (`scheduler.overrides`).
        for override in ScheduleOverride.objects.filter(row_key="", key__in=list(wanted)):
            wanted[override.key] = overridden(override)
        for task_id, slots in sorted(wanted.items()):
            desired: dict[str, Any] = {
                "task": DISPATCH_TASK,
                "args": json.dumps([task_id]),
                "kwargs": "{}",
                "queue": SCHEDULER_QUEUE,
                "description": DESCRIPTION.format(task_id=task_id),
                **schedule_fields(slots),
            }
            row = PeriodicTask.objects.select_for_update().filter(name=task_id).first()
            if row is None:
                PeriodicTask.objects.create(name=task_id, enabled=True, **desired)
                report.created.append(task_id)
                continue
            changed = [name for name, value in desired.items() if getattr(row, name) != value]
            for name in changed:
                setattr(row, name, desired[name])
            state = SchedulerState.objects.filter(key=state_key(task_id)).first()
            if state is not None and state.sync_disabled:
                state.sync_disabled = False
                state.save(update_fields=["sync_disabled", "updated_at"])
                if not row.enabled:
                    row.enabled = True
                    changed.append("enabled")
                    report.enabled_again.append(task_id)
            if changed:
                row.save()
                report.updated.append(task_id)
            else:
                report.unchanged.append(task_id)
        gone = PeriodicTask.objects.filter(task=DISPATCH_TASK).exclude(name__in=list(wanted))
        for row in gone.select_for_update():
            if not row.enabled:
                continue  # already off (by the operator or an earlier sync): left as it is
            row.enabled = False
            row.save()
            SchedulerState.objects.update_or_create(
                key=state_key(row.name),
                defaults={"sync_disabled": True},
                create_defaults={"task_id": row.name[:64], "sync_disabled": True},
            )
            report.disabled.append(row.name)
    log.info("sync_schedules: %s", report.summary())
    return report
