"""What the admin's Schedules page shows: every schedule, its last fire, its next fire and
whether it is on. Read-only; switching goes through `scheduler.switch`.

- Static schedules: every django-celery-beat `PeriodicTask` row. A row the sync manages
  (it calls the dispatch task) takes its cadence and target from the task's definition and
  its `enabled` from the operator (`scheduler.sync`); any other row is the operator's own.
  The next fires of a synced row are `orchestrator.slots`'s, the function the scheduler fires
  by (`NEXT_FIRES` of them, in the schedule's zone); an operator's own row, which beat alone
  fires, shows beat's estimate from its last run instead.
- Dynamic schedules: for each task declaring `dynamic(loader)`, the rows its loader returns
  now (the loader is called once per page) and the rows `scheduler_state` remembers that it
  no longer returns. A listed row fires at the first tick of each slot of its interval: the
  next fire is the start of the next slot, or the next tick when the current slot has not
  fired yet.

`schedule` and `fires` answer the next fires of one schedule after any moment, from the same
function (the API's `GET /schedules/fires`).

The last fire of both is `scheduler_state` (the fire path's record: the run started, or why
none was). Costs three queries and one call of each dynamic loader. A loader that raises is
shown with its error; the other schedules are still listed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django_celery_beat.models import PeriodicTask

from orchestrator.clock import SYSTEM, Clock
from orchestrator.models import ScheduleOverride, SchedulerState
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from orchestrator.scheduler.overrides import dynamic_overrides
from orchestrator.scheduler.sync import overridden, resolve, slots_of
from orchestrator.slots import CronSlots, IntervalSlots, Slots
from tasks import registry
from tasks.schedule import Cron, Dynamic, Every, ScheduleRow, time_zone, to_row

log = logging.getLogger(__name__)

NEXT_FIRES = 5  # what the Schedules page shows of each static schedule


@dataclass(frozen=True)
class LastFire:
    at: datetime | None
    run_id: str  # "" when the slot started no run (see error)
    error: str  # why the last claimed slot started no run

    @classmethod
    def of(cls, state: SchedulerState | None) -> LastFire:
        if state is None:
            return cls(None, "", "")
        return cls(state.last_fired_at, state.last_run_id, state.last_error)


@dataclass(frozen=True)
class StaticSchedule:
    name: str  # the beat row's name (the task id for a synced row)
    managed: bool  # synced from a definition (it calls the dispatch task)
    cadence: str
    enabled: bool
    last: LastFire
    beat_last_run_at: datetime | None  # beat's own record of its last send
    next_fire_at: datetime | None  # None while off, or for a schedule beat cannot estimate
    tz: str  # the zone its cron fields are read in (an interval's: LUMASTRA_TIME_ZONE)
    next_fires: tuple[datetime, ...]  # in `tz`; empty while off or for a solar or clocked row
    override: Override | None  # an operator's cadence, which the row runs on

    @property
    def owners(self) -> str:
        if self.managed:
            return "definition: cadence, task, args, queue; operator: enabled"
        return "operator: every field (not synced)"


@dataclass(frozen=True)
class Override:
    """An operator's cadence (`scheduler.overrides`): what it is, who set it, when."""

    cadence: str
    actor: str
    at: datetime

    @classmethod
    def of(cls, override: ScheduleOverride | None) -> Override | None:
        if override is None:
            return None
        return cls(overridden(override).describe(), override.actor, override.updated_at)


@dataclass(frozen=True)
class DynamicRow:
    task_id: str
    row_key: str
    interval: timedelta | None  # None: the loader no longer returns the row
    enabled: bool
    last: LastFire
    next_fire_at: datetime | None  # None while off or no longer listed
    override: Override | None  # an operator's cadence, in place of `interval`

    @property
    def listed(self) -> bool:
        return self.interval is not None


@dataclass(frozen=True)
class DynamicSchedule:
    task_id: str
    rows: tuple[DynamicRow, ...]
    error: str  # the loader's error; "" when it answered


def static_schedules(clock: Clock = SYSTEM) -> list[StaticSchedule]:
    now = clock.now()
    rows = list(
        PeriodicTask.objects.select_related("interval", "crontab", "solar", "clocked").order_by(
            "name"
        )
    )
    states = {
        s.key: s
        for s in SchedulerState.objects.filter(
            key__in=[state_key(r.name) for r in rows if r.task == DISPATCH_TASK]
        )
    }
    overrides = {o.key: o for o in ScheduleOverride.objects.filter(row_key="")}
    found = []
    for row in rows:
        managed = row.task == DISPATCH_TASK
        # An operator's own row is fired by beat alone, by its own arithmetic: its estimate.
        slots = slots_of(row) if managed else None
        coming = tuple(fires(slots, now, NEXT_FIRES)) if slots and row.enabled else ()
        beat_next = _beat_next(row, now, clock) if row.enabled and not slots else None
        found.append(
            StaticSchedule(
                name=row.name,
                managed=managed,
                cadence=slots.describe() if slots else str(row.scheduler or "-"),
                enabled=row.enabled,
                last=LastFire.of(states.get(state_key(row.name)) if managed else None),
                beat_last_run_at=row.last_run_at,
                next_fire_at=coming[0] if coming else beat_next,
                tz=zone_of(slots),
                next_fires=coming,
                override=Override.of(overrides.get(state_key(row.name)) if managed else None),
            )
        )
    return found


class UnknownSchedule(LookupError):
    """No static schedule of that name, or no such row of a dynamic schedule."""


class NotOurs(LookupError):
    """An operator's own beat row: beat fires it, by its own arithmetic, not the scheduler."""


def zone_of(slots: Slots | None) -> str:
    return slots.tz if isinstance(slots, CronSlots) else settings.CONFIG.time_zone


def fires(slots: Slots, after: datetime, count: int) -> list[datetime]:
    """The next `count` fires of `slots` strictly after `after`, in its zone."""
    zone = time_zone(zone_of(slots))
    return [moment.astimezone(zone) for moment in slots.fires(after, count)]


def schedule(name: str, row: str | None) -> Slots:
    """When a schedule fires: the static schedule `name` (a beat row's name; a synced row is
    named by its task id, and a task whose static schedule is not synced yet is read from its
    definition), or with `row`, that row of task `name`'s dynamic schedule (as its loader
    lists it now), with the operator's cadence when one is set."""
    slots: Slots | None
    if row is None:
        beat_row = (
            PeriodicTask.objects.select_related("interval", "crontab").filter(name=name).first()
        )
        definition = registry.get().get(name)
        if beat_row is not None and beat_row.task != DISPATCH_TASK:
            raise NotOurs(
                f"beat row {name!r} is not synced from a task: beat alone computes its fires"
            )
        if beat_row is not None:
            slots = slots_of(beat_row)
        elif definition is not None and isinstance(definition.schedule, Every | Cron):
            slots = resolve(definition, os.environ)
        else:
            raise UnknownSchedule(f"no static schedule named {name!r}")
        if slots is None:
            raise UnknownSchedule(f"static schedule {name!r} is neither an interval nor a cron")
    else:
        definition = registry.get().get(name)
        if definition is None or not isinstance(definition.schedule, Dynamic):
            raise UnknownSchedule(f"task {name!r} has no dynamic schedule")
        rows, error = _load(name, definition.schedule)
        listed = {r.key: r for r in rows}
        if row not in listed:
            raise UnknownSchedule(
                f"the loader of task {name!r} lists no row {row!r}"
                + (f" ({error})" if error else "")
            )
        interval = listed[row].interval
        assert not isinstance(interval, str)  # to_row parsed it
        override = dynamic_overrides().get(state_key(name, row))
        slots = overridden(override) if override else IntervalSlots(interval)
    return slots


def _beat_next(row: PeriodicTask, now: datetime, clock: Clock) -> datetime | None:
    """When beat sends the row next, by its own schedule (never earlier than now)."""
    if row.scheduler is None:
        return None
    schedule: Any = row.schedule
    schedule.nowfun = clock.now  # the estimate reads this clock, not the process's
    last = row.last_run_at or row.date_changed or now
    try:
        remaining: timedelta = schedule.remaining_estimate(last)
    except (AttributeError, NotImplementedError, ValueError):
        return None  # a solar or clocked row without an estimate
    return max(now, now + remaining)


def dynamic_schedules(clock: Clock = SYSTEM) -> list[DynamicSchedule]:
    now = clock.now()
    definitions = sorted(
        (d for d in registry.get().values() if isinstance(d.schedule, Dynamic)),
        key=lambda d: d.id,
    )
    loaded: dict[str, tuple[list[ScheduleRow], str]] = {
        d.id: _load(d.id, d.schedule) for d in definitions if isinstance(d.schedule, Dynamic)
    }
    overrides = dynamic_overrides()
    states: dict[str, dict[str, SchedulerState]] = {}
    for remembered in SchedulerState.objects.filter(task_id__in=list(loaded)).exclude(row_key=""):
        states.setdefault(remembered.task_id, {})[remembered.row_key] = remembered
    found = []
    for task_id, (rows, error) in loaded.items():
        known = states.get(task_id, {})
        listed = {row.key: row for row in rows}
        shown = []
        for row_key in sorted(listed.keys() | known.keys()):
            state = known.get(row_key)
            row = listed.get(row_key)
            interval = row.interval if row is not None else None
            assert not isinstance(interval, str)  # to_row parsed it
            enabled = not (state is not None and state.disabled)
            override = overrides.get(state_key(task_id, row_key))
            slots: Slots | None = None
            if override is not None:
                slots = overridden(override)
            elif interval is not None:
                slots = IntervalSlots(interval)
            shown.append(
                DynamicRow(
                    task_id=task_id,
                    row_key=row_key,
                    interval=interval,
                    enabled=enabled,
                    last=LastFire.of(state),
                    next_fire_at=(
                        _slot_next(slots, state, now) if enabled and row is not None else None
                    ),
                    override=Override.of(override),
                )
            )
        found.append(DynamicSchedule(task_id, tuple(shown), error))
    return found


def _load(task_id: str, schedule: Dynamic) -> tuple[list[ScheduleRow], str]:
    """The loader's rows now; a malformed row is left out and named, as the tick does."""
    try:
        values = list(schedule.loader())
    except Exception as exc:
        # Shown on the page with the task; the scheduler tick logs its own failures.
        log.warning("schedules page: the loader of task %s failed: %s", task_id, exc)
        return [], f"the loader failed: {type(exc).__name__}: {exc}"
    rows: list[ScheduleRow] = []
    problems: list[str] = []
    for value in values:
        try:
            rows.append(to_row(value))
        except ValueError as exc:
            problems.append(str(exc))
    return rows, "; ".join(f"row skipped: {p}" for p in problems)


def _slot_next(slots: Slots | None, state: SchedulerState | None, now: datetime) -> datetime | None:
    """The next tick when the current slot has not fired, else the next slot's start."""
    if slots is None:
        return None
    slot = slots.slot(now)
    if state is None or state.last_bucket is None or state.last_bucket < slot:
        return now
    return slots.fires(now, 1)[0]
