"""`/tasks`: the registry as clients need it to start runs (ids, queues, input schemas)."""

from __future__ import annotations

from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest
from ninja import Router, Schema

from orchestrator.routing import queue_name
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.schedule import Cron, Every, Schedule

router = Router(tags=["tasks"])


class TimeoutOut(Schema):
    soft_s: float
    hard_s: float


class ScheduleOut(Schema):
    kind: Literal["every", "cron"]
    every_s: float | None = None
    cron: str | None = None


class TaskOut(Schema):
    id: str
    description: str
    resource_class: str
    queue: str
    task_priority: int | None
    timeout: TimeoutOut
    processing_version: int
    input_schema: dict[str, Any]
    schedule: ScheduleOut | None


def _schedule(schedule: Schedule | None) -> ScheduleOut | None:
    if isinstance(schedule, Every):
        return ScheduleOut(kind="every", every_s=schedule.interval.total_seconds())
    if isinstance(schedule, Cron):
        return ScheduleOut(kind="cron", cron=schedule.expression)
    return None


def _task(definition: TaskDefinition) -> TaskOut:
    return TaskOut(
        id=definition.id,
        description=definition.description,
        resource_class=definition.resource_class,
        queue=queue_name(definition, settings.CONFIG.per_task_queues),
        task_priority=definition.task_priority,
        timeout=TimeoutOut(
            soft_s=definition.timeout.soft.total_seconds(),
            hard_s=definition.timeout.hard.total_seconds(),
        ),
        processing_version=definition.processing_version,
        input_schema=definition.input_model.model_json_schema(),
        schedule=_schedule(definition.schedule),
    )


@router.get("/tasks", response=list[TaskOut])
def list_tasks(request: HttpRequest) -> list[TaskOut]:
    """Every registered task, by id."""
    found = registry.get()
    return [_task(found[task_id]) for task_id in sorted(found)]
