"""The "Tasks" page (view permission): one row per registered task — what it is (class, queue,
default priority, static schedule), how it went (its last run; success rate and p50/p95
duration of the runs that ended in the last 24 h), and its admission status (circuit with any
force-enable and its expiry, quota and spend against caps, queue depth against the class's
cap, running against its limit, rate, refusals today), and the pauses over it (its own, its
class's: who paused, when, why). The drain's poison list is on the Dead letters page
(`dead_letters`). Operators also get a force-enable button (`force_enable`), pause and resume
buttons for the task and its class (`pause`) and a link to the start form with the task
chosen (`start_form`).

Every label comes from the registry at render time. Whatever the number of tasks or runs, the
page costs two queries on `task_history` (`admin.stats`: one range scan of the last day's ends,
one index probe per task for the newest run), one of the pauses in force, plus the overview's
reads (`hooks.overview`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from orchestrator.admin import pages, stats
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.clock import SYSTEM, Clock, describe
from orchestrator.hooks import overview
from orchestrator.models import TaskPause
from orchestrator.recovery import pauses
from orchestrator.routing import queue_name
from orchestrator.scheduler.sync import ScheduleConfigError, resolve
from orchestrator.slots import CronSlots, IntervalSlots
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.schedule import Dynamic, Every

_UNITS = ((86_400, "d"), (3_600, "h"), (60, "m"), (1, "s"))


@dataclass(frozen=True)
class TaskRow:
    definition: TaskDefinition
    status: overview.TaskStatus
    half_open_in: str | None  # while the circuit is open
    forced_for: str | None  # while a force-enable holds: the time left until it expires
    queue: str
    priority: str
    schedule: str | None
    ended: stats.Ended  # in the last stats.WINDOW
    last_run: stats.LastRun | None
    start_url: str | None  # operators only
    pauses: list[TaskPause]  # in force over this task: its own, its class's

    @property
    def success_percent(self) -> float | None:
        rate = self.ended.success_rate
        return None if rate is None else rate * 100

    @property
    def p50(self) -> str | None:
        return None if self.ended.p50 is None else duration(self.ended.p50)

    @property
    def p95(self) -> str | None:
        return None if self.ended.p95 is None else duration(self.ended.p95)


def duration(span: timedelta) -> str:
    """A run's duration as operators read it: "420 ms", "11 s", "2.5 min", "3.1 h"."""
    seconds = span.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3_600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3_600:.3g} h"


def _interval(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    return next(f"{seconds // size}{unit}" for size, unit in _UNITS if seconds % size == 0)


def schedule_text(definition: TaskDefinition) -> str | None:
    """The task's static schedule as beat runs it (its env_override applied, as the sync does),
    "dynamic" for rows from a loader, None for none."""
    schedule = definition.schedule
    if schedule is None:
        return None
    if isinstance(schedule, Dynamic):
        return "dynamic (rows from its loader)"
    try:
        slots = resolve(definition, os.environ)
    except ScheduleConfigError as exc:
        return f"not synced: {exc}"
    if isinstance(slots, CronSlots):
        return f"cron {slots.expression} (UTC)"
    assert isinstance(slots, IntervalSlots)
    text = f"every {_interval(slots.interval)}"
    if isinstance(schedule, Every) and slots.interval != schedule.interval:
        text += f" (from {schedule.env_override}; declared {_interval(schedule.interval)})"
    return text


def priority_text(definition: TaskDefinition) -> str:
    """The task's own priority, else "by trigger" (`triggers.PRIORITY_BY_TRIGGER`)."""
    if definition.task_priority is None:
        return "by trigger"
    return f"{definition.task_priority.value} {definition.task_priority.name.lower()}"


def rows(
    definitions: list[TaskDefinition], *, can_operate: bool, clock: Clock = SYSTEM
) -> list[TaskRow]:
    """One row per definition, in their order: two queries on task_history whatever the
    number of tasks or runs, plus the overview's reads. Start links only for operators."""
    ids = [definition.id for definition in definitions]
    statuses = overview.task_statuses(definitions, clock=clock)
    ended = stats.ended(ids, clock=clock)
    last = stats.last_runs(ids)
    start = reverse("admin:orchestrator_taskhistory_start")
    now = clock.now()
    in_force = {(row.scope, row.name): row for row in pauses.in_force()}
    found = []
    for definition in definitions:
        status = statuses[definition.id]
        wait = status.circuit.time_to_half_open
        forced_until = status.circuit.forced_until
        found.append(
            TaskRow(
                definition=definition,
                status=status,
                half_open_in=None if wait is None else describe(wait),
                forced_for=None if forced_until is None else describe(forced_until - now),
                queue=queue_name(definition, settings.CONFIG.per_task_queues),
                priority=priority_text(definition),
                schedule=schedule_text(definition),
                ended=ended[definition.id],
                last_run=last.get(definition.id),
                start_url=f"{start}?{urlencode({'task': definition.id})}" if can_operate else None,
                pauses=[
                    in_force[key]
                    for key in (("task", definition.id), ("class", definition.resource_class))
                    if key in in_force
                ],
            )
        )
    return found


def tasks_view(request: HttpRequest) -> HttpResponse:
    definitions = sorted(registry.get().values(), key=lambda d: d.id)
    can_operate = access.allows(request.user, Access.OPERATE)
    page = pages.context(
        request,
        "Tasks",
        rows=rows(definitions, can_operate=can_operate),
        window_hours=round(stats.WINDOW.total_seconds() / 3_600),
        can_operate=can_operate,
    )
    return TemplateResponse(request, "admin/orchestrator/tasks.html", page)


def url() -> URLPattern:
    return path("tasks/", pages.requires(Access.VIEW, tasks_view), name="orchestrator_tasks")
