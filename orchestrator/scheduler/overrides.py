"""The operator owns the cadence: a durable override per schedule (`ScheduleOverride`).

An override gives one schedule a cadence of the operator's: a cron expression in a zone, or an
interval in seconds. It applies to a static schedule (by name, the task id) or to one row of
a dynamic schedule (task and row key), and records who set it and when.

- A static schedule's override is written to its beat row in the same transaction, so the
  scheduler tick of every replica reads it at its next tick, beat at its next check of the
  rows. `sync_schedules` (and so every deploy) keeps it: the sync writes the override's
  cadence, not the definition's, while one exists. A schedule not synced yet gets it at its
  first sync. An operator's own beat row (one that does not call the dispatch task) is edited
  in beat's admin, not here.
- A dynamic row's override is read by the tick every tick (one query) in place of the
  interval its loader gives.
- "Reset to the definition" deletes the override and puts the definition's cadence back.

An edit never fires a slot twice: a slot is a moment, and the fire path claims it only when
it is newer than the last one fired (`fire.fire`); the new cadence's slots that are not newer
are not fired. Its current slot, if newer, fires at the next tick (as a new schedule's
would: a dynamic row's at once, a static one's when it began at most `dynamic.ON_TIME_S`
ago, else when beat next finds the row due); each later slot when it begins. A cron's zone is
fixed when it is set (its own, else the setter's LUMASTRA_TIME_ZONE).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django_celery_beat.models import PeriodicTask

from orchestrator.models import ScheduleOverride
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from orchestrator.scheduler.switch import UnknownSchedule, check_dynamic
from orchestrator.scheduler.sync import (
    ScheduleConfigError,
    lock_cadences,
    resolve,
    schedule_fields,
    static_definitions,
)
from orchestrator.slots import Slots, cadence
from tasks import registry
from tasks.schedule import MAX_JITTER_S, cron, time_zone

log = logging.getLogger(__name__)

# An interval an override may give: a second to a year.
MAX_EVERY_S = 366 * 86_400
# The longest each cron field may be: django-celery-beat's CrontabSchedule columns.
_CRON_FIELDS = {"minute": 240, "hour": 96, "day of month": 124, "month": 64, "day of week": 64}


class BadOverride(ValueError):
    """A field of an override that cannot be used; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class CannotOverride(ValueError):
    """The beat row is an operator's own (its cadence is edited in beat's admin), or the
    definition's cadence cannot be read back (a bad `env_override` value)."""


@dataclass(frozen=True)
class Cadence:
    """What an operator asks for: `cron` (with `tz`, default LUMASTRA_TIME_ZONE) or `every_s`,
    and `jitter_s` (None: the definition's)."""

    cron: str = ""
    every_s: int | None = None
    tz: str = ""
    jitter_s: int | None = None

    def slots(self) -> Slots:
        """The schedule it makes; BadOverride names the field that cannot be used."""
        if bool(self.cron) == (self.every_s is not None):
            raise BadOverride("cron", "give either cron or every_s, not both or neither")
        if self.jitter_s is not None and not 0 <= self.jitter_s <= MAX_JITTER_S:
            raise BadOverride("jitter_s", f"must be 0 to {MAX_JITTER_S} seconds")
        if self.jitter_s and self.every_s is not None and self.jitter_s >= self.every_s:
            raise BadOverride("jitter_s", "must be shorter than the interval")
        if self.every_s is not None:
            if self.tz:
                raise BadOverride("tz", "a zone applies to a cron; an interval is elapsed time")
            if not 1 <= self.every_s <= MAX_EVERY_S:
                raise BadOverride("every_s", f"must be 1 to {MAX_EVERY_S} seconds")
            return cadence("", self.every_s, "")
        try:
            cron(self.cron)
        except ValueError as exc:
            raise BadOverride("cron", str(exc)) from None
        for name, text in zip(_CRON_FIELDS, self.cron.split(), strict=True):
            if len(text) > _CRON_FIELDS[name]:
                raise BadOverride("cron", f"its {name} field is longer than {_CRON_FIELDS[name]}")
        try:
            time_zone(self.zone())
        except ValueError as exc:
            raise BadOverride("tz", str(exc)) from None
        slots = cadence(self.cron, None, self.zone())
        if not slots.fires(datetime.now(UTC), 1):
            raise BadOverride("cron", f"{self.cron!r} names no moment in the next five years")
        return slots

    def zone(self) -> str:
        """The zone a cron is read in, fixed when it is set: replicas that disagree on
        LUMASTRA_TIME_ZONE during a rolling change still compute the same slots."""
        return self.tz or settings.CONFIG.time_zone


def set_static(name: str, wanted: Cadence, *, actor: str) -> ScheduleOverride:
    """Give the static schedule `name` the operator's cadence."""
    with transaction.atomic():
        lock_cadences()
        row = _managed_row(name)  # an unknown schedule is a 404 before a bad field is a 422
        slots = wanted.slots()
        override = _save(name, name, "", wanted, actor)
        if row is not None:
            _write(row, slots)
    log.info("schedule %s: cadence %s set by %s", name, slots.describe(), actor)
    return override


def reset_static(name: str, *, actor: str) -> bool:
    """Drop the override of `name`; the definition's cadence is back. False: it had none."""
    with transaction.atomic():
        lock_cadences()
        row = _managed_row(name)
        deleted, _ = ScheduleOverride.objects.filter(key=state_key(name)).delete()
        definition = registry.get().get(name)
        if row is not None and definition in static_definitions():
            assert definition is not None
            try:
                # This process's environment; the next sync writes what the beat role's says.
                slots = resolve(definition, os.environ)
            except ScheduleConfigError as exc:
                raise CannotOverride(f"the definition's cadence cannot be read: {exc}") from None
            _write(row, slots)
    if deleted:
        log.info("schedule %s: cadence reset to the definition by %s", name, actor)
    return bool(deleted)


def set_dynamic(task_id: str, row_key: str, wanted: Cadence, *, actor: str) -> ScheduleOverride:
    """Give one row of a dynamic schedule the operator's cadence."""
    check_dynamic(task_id, row_key)
    slots = wanted.slots()
    override = _save(state_key(task_id, row_key), task_id, row_key, wanted, actor)
    log.info("schedule %s: cadence %s set by %s", override.key, slots.describe(), actor)
    return override


def reset_dynamic(task_id: str, row_key: str, *, actor: str) -> bool:
    check_dynamic(task_id, row_key)
    key = state_key(task_id, row_key)
    deleted, _ = ScheduleOverride.objects.filter(key=key).delete()
    if deleted:
        log.info("schedule %s: cadence reset to the loader's by %s", key, actor)
    return bool(deleted)


def dynamic_overrides() -> dict[str, ScheduleOverride]:
    """Every dynamic row's override, by state key."""
    return {o.key: o for o in ScheduleOverride.objects.exclude(row_key="")}


def every_override() -> dict[str, ScheduleOverride]:
    """Every override, static and dynamic, by state key (what the tick reads, once)."""
    return {o.key: o for o in ScheduleOverride.objects.all()}


def _managed_row(name: str) -> PeriodicTask | None:
    """The synced beat row of `name`, locked; None while a static schedule is not synced yet."""
    row = PeriodicTask.objects.select_for_update().filter(name=name).first()
    if row is not None and row.task != DISPATCH_TASK:
        raise CannotOverride(
            f"beat row {name!r} is not synced from a task: edit it under Periodic tasks"
        )
    if row is None and name not in {d.id for d in static_definitions()}:
        raise UnknownSchedule(f"no static schedule named {name!r}")
    return row


def _save(key: str, task_id: str, row_key: str, wanted: Cadence, actor: str) -> ScheduleOverride:
    override, _ = ScheduleOverride.objects.update_or_create(
        key=key,
        defaults={
            "task_id": task_id,
            "row_key": row_key,
            "cron": wanted.cron,
            "every_s": wanted.every_s,
            "tz": wanted.zone() if wanted.cron else "",
            "jitter_s": wanted.jitter_s,
            "actor": actor,
        },
    )
    return override


def _write(row: PeriodicTask, slots: Slots) -> None:
    for name, value in schedule_fields(slots).items():
        setattr(row, name, value)
    row.save()  # through the model: beat hears of the change
