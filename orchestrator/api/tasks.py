"""`/tasks`: the registry as clients need it to start runs (ids, queues, input schemas), with
each task's admission status (`orchestrator.hooks.overview`), and the operator's force-enable.

Views never write state: force-enable is `circuit.force_enable`, under the caller's name.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest
from ninja import Field, Router, Schema

from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.hooks import circuit, overview
from orchestrator.hooks.circuit import CircuitStatus
from orchestrator.hooks.overview import TaskStatus
from orchestrator.models import CircuitState
from orchestrator.routing import queue_name
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.registry import UnknownTaskError
from tasks.schedule import Cron, Every, Schedule

router = Router(tags=["tasks"])


class TimeoutOut(Schema):
    soft_s: float
    hard_s: float


class ScheduleOut(Schema):
    kind: Literal["every", "cron"]
    every_s: float | None = None
    cron: str | None = None


class CircuitOut(Schema):
    state: CircuitState = Field(
        description="`open` refuses starts; `half_open` admits one probe run; `closed` admits"
    )
    consecutive_failures: int
    reopen_count: int = Field(description="times it opened in a row without closing")
    opened_at: datetime | None
    half_open_at: datetime | None
    time_to_half_open_s: float | None = Field(description="while open: seconds to half-open")
    forced_until: datetime | None = Field(description="while force-enabled by an operator")
    forced_by: str | None
    probe_run_id: str | None = Field(description="the half-open probe run, while it runs")


class QuotaTodayOut(Schema):
    day: date = Field(description="the UTC day counted")
    started: int
    completed: int
    failed: int
    max_runs_per_day: int | None = Field(description="null: no daily quota")
    cost: dict[str, float] = Field(description="units spent today by kind (`ctx.spend`)")
    max_cost_per_day: dict[str, float] = Field(
        description="daily caps by cost kind; a start is refused (429) once one is reached"
    )


class QueueDepthOut(Schema):
    resource_class: str
    waiting: int = Field(description="messages of the class's tasks waiting in the broker")
    cap: int = Field(description="at the cap, a start follows the task's backpressure policy")


class SlotsOut(Schema):
    running: int = Field(description="runs holding a concurrency slot")
    limit: int | None = Field(
        description="max_concurrent; null: no limit but the pools' processes on each host"
    )


class TaskStatusOut(Schema):
    circuit: CircuitOut
    quota_today: QuotaTodayOut
    refusals_today: dict[str, int] = Field(description="refused starts today, by refusal code")
    queue: QueueDepthOut
    concurrency: SlotsOut
    rate: str | None = Field(description='e.g. "60/m"; null: no rate limit')


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
    status: TaskStatusOut


def _schedule(schedule: Schedule | None) -> ScheduleOut | None:
    if isinstance(schedule, Every):
        return ScheduleOut(kind="every", every_s=schedule.interval.total_seconds())
    if isinstance(schedule, Cron):
        return ScheduleOut(kind="cron", cron=schedule.expression)
    return None


def circuit_out(found: CircuitStatus) -> CircuitOut:
    wait = found.time_to_half_open
    return CircuitOut(
        state=found.state,
        consecutive_failures=found.consecutive_failures,
        reopen_count=found.reopen_count,
        opened_at=found.opened_at,
        half_open_at=found.half_open_at,
        time_to_half_open_s=None if wait is None else wait.total_seconds(),
        forced_until=found.forced_until,
        forced_by=found.forced_by,
        probe_run_id=found.probe_run_id,
    )


def _status(found: TaskStatus) -> TaskStatusOut:
    quota = found.quota_today
    return TaskStatusOut(
        circuit=circuit_out(found.circuit),
        quota_today=QuotaTodayOut(
            day=quota.day,
            started=quota.started,
            completed=quota.completed,
            failed=quota.failed,
            max_runs_per_day=quota.max_runs_per_day,
            cost=quota.cost,
            max_cost_per_day=quota.max_cost_per_day,
        ),
        refusals_today=found.refusals_today,
        queue=QueueDepthOut(
            resource_class=found.queue.resource_class,
            waiting=found.queue.waiting,
            cap=found.queue.cap,
        ),
        concurrency=SlotsOut(running=found.concurrency.running, limit=found.concurrency.limit),
        rate=found.rate,
    )


def _task(definition: TaskDefinition, status: TaskStatus) -> TaskOut:
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
        status=_status(status),
    )


def _definition(task_id: str) -> TaskDefinition:
    try:
        return registry.get()[task_id]
    except UnknownTaskError as exc:
        raise ApiError(404, str(exc)) from None


@router.get("/tasks", auth=VIEW, response=answers({200: list[TaskOut]}))
def list_tasks(request: HttpRequest) -> list[TaskOut]:
    """Every registered task, by id, with its status."""
    found = registry.get()
    definitions = [found[task_id] for task_id in sorted(found)]
    statuses = overview.task_statuses(definitions)
    return [_task(definition, statuses[definition.id]) for definition in definitions]


@router.get("/tasks/{task_id}", auth=VIEW, response=answers({200: TaskOut}, 404))
def get_task(request: HttpRequest, task_id: str) -> TaskOut:
    definition = _definition(task_id)
    return _task(definition, overview.task_status(definition))


@router.post(
    "/tasks/{task_id}/circuit/force-enable", auth=OPERATE, response=answers({200: CircuitOut}, 404)
)
def force_enable_circuit(request: HttpRequest, task_id: str) -> CircuitOut:
    """Close the task's circuit and keep it admitting for LUMASTRA_CIRCUIT_FORCE_ENABLE_TTL_S,
    recorded under the caller's username; answers with the circuit as it is now."""
    definition = _definition(task_id)
    return circuit_out(circuit.force_enable(definition.id, actor=current_user(request).username))
