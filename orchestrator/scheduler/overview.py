"""What the admin's Schedules page shows: every schedule, its last fire, its next fire and
whether it is on. Read-only; switching goes through `scheduler.switch`.

- Static schedules: every django-celery-beat `PeriodicTask` row. A row the sync manages
  (it calls the dispatch task) takes its cadence and target from the task's definition and
  its `enabled` from the operator (`scheduler.sync`); any other row is the operator's own.
  The next fire is beat's own estimate: the row's celery schedule from its last run (beat's
  `last_run_at`, else the moment the row last changed, as beat assumes), read on `clock`.
- Dynamic schedules: for each task declaring `dynamic(loader)`, the rows its loader returns
  now (the loader is called once per page) and the rows `scheduler_state` remembers that it
  no longer returns. A listed row fires at the first tick of each slot of its interval: the
  next fire is the start of the next slot, or the next tick when the current slot has not
  fired yet.

The last fire of both is `scheduler_state` (the fire path's record: the run started, or why
none was). Costs three queries and one call of each dynamic loader. A loader that raises is
shown with its error; the other schedules are still listed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django_celery_beat.models import PeriodicTask

from orchestrator.clock import SYSTEM, Clock
from orchestrator.models import SchedulerState
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from orchestrator.scheduler.slots import IntervalSlots
from tasks import registry
from tasks.schedule import Dynamic, ScheduleRow, to_row

log = logging.getLogger(__name__)


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

    @property
    def owners(self) -> str:
        if self.managed:
            return "definition: cadence, task, args, queue; operator: enabled"
        return "operator: every field (not synced)"


@dataclass(frozen=True)
class DynamicRow:
    task_id: str
    row_key: str
    interval: timedelta | None  # None: the loader no longer returns the row
    enabled: bool
    last: LastFire
    next_fire_at: datetime | None  # None while off or no longer listed

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
    found = []
    for row in rows:
        managed = row.task == DISPATCH_TASK
        found.append(
            StaticSchedule(
                name=row.name,
                managed=managed,
                cadence=str(row.scheduler) if row.scheduler is not None else "-",
                enabled=row.enabled,
                last=LastFire.of(states.get(state_key(row.name)) if managed else None),
                beat_last_run_at=row.last_run_at,
                next_fire_at=_beat_next(row, now, clock) if row.enabled else None,
            )
        )
    return found


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
            shown.append(
                DynamicRow(
                    task_id=task_id,
                    row_key=row_key,
                    interval=interval,
                    enabled=enabled,
                    last=LastFire.of(state),
                    next_fire_at=(
                        _slot_next(interval, state, now)
                        if enabled and interval is not None
                        else None
                    ),
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


def _slot_next(interval: timedelta, state: SchedulerState | None, now: datetime) -> datetime:
    """The next tick when the current slot has not fired, else the next slot's start."""
    slot = IntervalSlots(interval).slot(now)
    if state is None or state.last_bucket is None or state.last_bucket < slot:
        return now
    return datetime.fromtimestamp(slot, tz=UTC) + interval
