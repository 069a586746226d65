"""The "Tasks" page (view permission): every task's admission status — circuit, quota,
depth, running against its limit — and the terminal writes the drain gave up on. The
force-enable buttons (`force_enable`) are shown to operators only."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from orchestrator.admin import pages
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.clock import describe
from orchestrator.hooks import overview
from orchestrator.runs import drain
from tasks import registry
from tasks.definition import TaskDefinition

POISON_SHOWN = 50


@dataclass(frozen=True)
class _TaskRow:
    definition: TaskDefinition
    status: overview.TaskStatus
    half_open_in: str | None  # while the circuit is open

    @classmethod
    def of(cls, definition: TaskDefinition, status: overview.TaskStatus) -> _TaskRow:
        wait = status.circuit.time_to_half_open
        return cls(definition, status, None if wait is None else describe(wait))


def tasks_view(request: HttpRequest) -> HttpResponse:
    definitions = sorted(registry.get().values(), key=lambda d: d.id)
    statuses = overview.task_statuses(definitions)
    page = pages.context(
        request,
        "Tasks",
        rows=[_TaskRow.of(definition, statuses[definition.id]) for definition in definitions],
        # Terminal writes the drain gave up on: runs whose end Postgres never recorded.
        poisoned=drain.poisoned(POISON_SHOWN),
        can_operate=access.allows(request.user, Access.OPERATE),
    )
    return TemplateResponse(request, "admin/orchestrator/tasks.html", page)


def url() -> URLPattern:
    return path("tasks/", pages.requires(Access.VIEW, tasks_view), name="orchestrator_tasks")
