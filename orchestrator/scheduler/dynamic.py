"""The scheduler loop: every 10 s, fires the static schedules' slots that are due and the due
rows of `schedule=dynamic(loader)` tasks.

Static schedules: each enabled synced beat row whose current slot (`orchestrator.slots`, the
one function every view reads too) began at most `policies.ON_TIME_S` ago (or three ticks,
when LUMASTRA_SCHEDULER_TICK_S is longer) and has not fired is fired
here, so a schedule fires at the moments that function names (to within a tick) whatever
beat's own clock arithmetic does across a daylight-saving change. Beat's message for the
same slot then finds it fired and fires nothing; a slot older than that (the loops
were down) is left to beat and to the boot catch-up, as before. Costs one query per tick
(the rows), and one more when a slot is due. A schedule that declares `pause_on_failure` is
switched off first when its last runs all failed (`scheduler.policies`).

Dynamic schedules: each tick, for each task whose definition declares `dynamic(loader)`:
1. calls `loader()` (the task author's one cheap query) for the rows `(key, input, interval)`;
2. computes each row's current slot (`floor(now / interval) * interval`, or the slot of the
   cadence an operator gave the row, `scheduler.overrides`, read once a tick); a row whose slot
   this process already saw fired is not due, so an idle tick costs the loaders' queries and
   nothing else. The rows left are looked up in `scheduler_state` in one query (another
   replica may have fired them), and those still due are fired through `fire.fire`, with
   the bucket lock `lock:scheduler:<taskId>:<rowKey>@<slot>`.

A row fires once per slot of its own interval, at the first tick in the slot: a new row
fires at once, and a row whose slots were missed (the loops were down) fires once, not once
per missed slot. A row an operator switched off (`scheduler_state.disabled`,
`scheduler.switch`) is skipped while off, at the cost of one query per tick; switched on
again, it fires at the next tick if its current slot has not fired. Every loops process runs
this loop; the bucket locks and the slot claim make one fire per row and slot across the
cluster, so it needs no leader.

The loop's first tick (`boot`) runs the static boot catch-up (`catchup.catch_up`) and then a
regular tick.

Isolation: a loader that raises is logged with its task id; a row that is malformed (no
key, a bad interval) or whose input the task rejects is logged with its key (the latter is
recorded in `scheduler_state.last_error`, and retried next slot); the other rows and tasks
go on. A tick never overlaps another tick of the same scheduler: a concurrent call returns
at once, reported as skipped.

Options: LUMASTRA_SCHEDULER_TICK_S (10), the tick interval, which is also the most a row
fires after its slot starts.

Not guaranteed: a row removed from the loader's answer after the loader ran can still get
the fire that tick decided on. `scheduler_state` rows of rows that went away are kept (they
are the rows' history), not pruned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from django_celery_beat.models import PeriodicTask

from orchestrator.clock import SYSTEM, Clock
from orchestrator.models import ScheduleOverride, SchedulerState
from orchestrator.scheduler import policies
from orchestrator.scheduler.catchup import CatchUpReport, catch_up
from orchestrator.scheduler.fire import FireRequest, Outcome, fire
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from orchestrator.scheduler.overrides import every_override
from orchestrator.scheduler.sync import overridden, slots_of
from orchestrator.slots import IntervalSlots
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.schedule import Dynamic, ScheduleRow, to_row

log = logging.getLogger(__name__)

NAME = "scheduler"


# A static slot that began longer ago than this is not fired by the tick (see the module doc).
@dataclass
class SchedulerTickReport:
    skipped: bool = False  # a tick of this scheduler was already running
    rows: int = 0  # rows the loaders returned
    due: int = 0  # rows whose slot this process had not seen fired
    fired: list[str] = field(default_factory=list)  # state keys fired by this tick
    refused: list[str] = field(default_factory=list)  # slot claimed, no run (see last_error)
    switched_off: list[str] = field(default_factory=list)  # due, but an operator disabled it
    paused: list[str] = field(default_factory=list)  # switched off now by pause_on_failure
    errors: int = 0  # loaders that raised, malformed rows, rows that raised
    catch_up: CatchUpReport | None = None


class Scheduler:
    def __init__(
        self, *, definitions: Iterable[TaskDefinition] | None = None, clock: Clock = SYSTEM
    ) -> None:
        self._definitions = None if definitions is None else tuple(definitions)
        self.clock = clock
        self._running = threading.Lock()
        # state key → the newest slot this process knows was fired (by anyone).
        self._fired: dict[str, int] = {}

    def dynamic_definitions(self) -> list[TaskDefinition]:
        source = registry.get().values() if self._definitions is None else self._definitions
        return [d for d in source if isinstance(d.schedule, Dynamic)]

    def boot(self) -> SchedulerTickReport:
        """The loop's first tick: the static boot catch-up, then a regular tick."""
        caught_up = catch_up(self.clock)
        report = self.tick()
        report.catch_up = caught_up
        return report

    def tick(self) -> SchedulerTickReport:
        report = SchedulerTickReport()
        if not self._running.acquire(blocking=False):
            report.skipped = True
            return report
        try:
            overrides = every_override()
            self._tick_static(report, overrides)
            definitions = self.dynamic_definitions()
            for definition in definitions:
                self._tick_task(definition, overrides, report)
        finally:
            self._running.release()
        if report.fired or report.refused or report.errors:
            log.info(
                "%s tick: %d rows, fired %s, refused %s, %d errors",
                NAME,
                report.rows,
                ", ".join(report.fired) or "none",
                ", ".join(report.refused) or "none",
                report.errors,
            )
        return report

    def _tick_static(
        self, report: SchedulerTickReport, overrides: Mapping[str, ScheduleOverride]
    ) -> None:
        now = self.clock.now()
        due: list[tuple[str, str, int]] = []
        rows = list(
            PeriodicTask.objects.select_related("interval", "crontab").filter(
                task=DISPATCH_TASK, enabled=True
            )
        )
        report.paused = policies.pause_failing(rows)
        rows = [row for row in rows if row.name not in report.paused]
        on_time = policies.on_time_s()
        for row in rows:
            try:
                slots = slots_of(row)
                slot = slots.slot(now) if slots is not None else None
            except ValueError as exc:  # a cron that names no moment (31 February)
                report.errors += 1
                log.error("%s: schedule %s has no slot: %s", NAME, row.name, exc)
                continue
            key = state_key(row.name)
            if slot is None or slots is None:
                continue
            jitter_s = policies.jitter_of(row.name, overrides.get(key))
            late = now.timestamp() - slot - policies.fire_delay(slots, key, slot, jitter_s)
            # A jittered slot is the tick's alone (beat's message came early): fired whenever
            # its delay is over, within the schedule's catch-up window if it declares one.
            within = policies.of(row.name).catch_up_within_s if jitter_s else on_time
            if late < 0 or (within is not None and now.timestamp() - slot > max(within, on_time)):
                continue
            if self._fired.get(key, -1) < slot:
                due.append((row.name, key, slot))
        if not due:
            return
        report.due += len(due)
        known = dict(
            SchedulerState.objects.filter(key__in=[key for _, key, _ in due]).values_list(
                "key", "last_bucket"
            )
        )
        for name, key, slot in due:
            last = known.get(key)
            if last is not None and last >= slot:
                self._fired[key] = last
                continue
            self._fire(FireRequest(name, slot), key, now, report)

    def _fire(
        self, request: FireRequest, key: str, now: datetime, report: SchedulerTickReport
    ) -> None:
        try:
            result = fire(request, now)
        except Exception:
            report.errors += 1
            log.exception("%s: schedule %s failed to fire", NAME, key)
            return
        if result.outcome is Outcome.LOCKED:
            return  # another replica is firing it; the next tick reads its state
        self._fired[key] = request.slot
        if result.outcome is Outcome.FIRED:
            report.fired.append(key)
        elif result.outcome is Outcome.REFUSED:
            report.refused.append(key)

    def _load(self, definition: TaskDefinition, report: SchedulerTickReport) -> list[ScheduleRow]:
        assert isinstance(definition.schedule, Dynamic)
        try:
            loaded = list(definition.schedule.loader())
        except Exception:
            report.errors += 1
            log.exception("%s: the loader of task %s failed", NAME, definition.id)
            return []
        rows: dict[str, ScheduleRow] = {}
        for value in loaded:
            try:
                row = to_row(value)
            except Exception as exc:
                report.errors += 1
                key = getattr(value, "key", value[0] if isinstance(value, tuple) else value)
                log.error("%s: task %s row %r skipped: %s", NAME, definition.id, key, exc)
                continue
            if row.key in rows:
                report.errors += 1
                log.error("%s: task %s row %r listed twice", NAME, definition.id, row.key)
                continue
            rows[row.key] = row
        return list(rows.values())

    def _tick_task(
        self,
        definition: TaskDefinition,
        overrides: Mapping[str, ScheduleOverride],
        report: SchedulerTickReport,
    ) -> None:
        rows = self._load(definition, report)
        report.rows += len(rows)
        now = self.clock.now()
        due: list[tuple[ScheduleRow, str, int]] = []
        for row in rows:
            assert not isinstance(row.interval, str)  # to_row parsed it
            key = state_key(definition.id, row.key)
            override = overrides.get(key)
            slots = overridden(override) if override else IntervalSlots(row.interval)
            try:
                slot = slots.slot(now)
            except ValueError as exc:  # an override's cron that names no moment
                report.errors += 1
                log.error("%s: schedule %s has no slot: %s", NAME, key, exc)
                continue
            delay = policies.fire_delay(
                slots, key, slot, policies.jitter_of(definition.id, override)
            )
            if self._fired.get(key, -1) < slot and now.timestamp() >= slot + delay:
                due.append((row, key, slot))
        if not due:
            return
        report.due += len(due)
        known: dict[str, int | None] = {}
        switched_off: set[str] = set()
        for key, last, disabled in SchedulerState.objects.filter(
            key__in=[key for _, key, _ in due]
        ).values_list("key", "last_bucket", "disabled"):
            known[key] = last
            if disabled:
                switched_off.add(key)
        for row, key, slot in due:
            if key in switched_off:
                # Not remembered as fired: switched on again, it fires at the next tick.
                report.switched_off.append(key)
                continue
            last = known.get(key)
            if last is not None and last >= slot:
                self._fired[key] = last
                continue
            request = FireRequest(definition.id, slot, row_key=row.key, input=row.input)
            self._fire(request, key, now, report)
