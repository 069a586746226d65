"""Registers one Celery task per task definition, named by its id, whose body is the runner's
`on_message`; and one per pipeline stage, named `<task id>.<stage>`, whose body runs that stage.
Traced (`orchestrator.tracing`), each body runs in its message's spans."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from celery import Task, shared_task

from orchestrator import tracing
from orchestrator.cluster.instance import instance_id
from orchestrator.routing import stage_class
from orchestrator.runs import runner, stage_attempts
from orchestrator.runs.publish import stage_task_name
from tasks.definition import TaskDefinition
from tasks.pipeline import Stage
from tasks.registry import Registry

# shared_task registers with every app; registering twice would replace the task class.
_registered: set[str] = set()
# Celery's own hard limit is only the backstop: the run's watchdog (orchestrator.runs.watch) ends
# the run in both stores at the hard timeout first, which Celery's kill cannot do.
HARD_LIMIT_GRACE_S = 30
# A run's or a stage's Celery body (`runner.on_message`, a stage's `body`).
Body = TypeVar("Body", bound=Callable[..., None])


# Celery's Task takes no type parameters at run time (they are the stubs').
class RunTask(Task):  # type: ignore[type-arg]
    """Every run's and stage's Celery task: Celery's, but for a pool process the worker role's
    hand back killed, whose message goes back without a crash report (`runs.stopping`)."""

    Request = "orchestrator.runs.stopping:Request"


def register_all(registry: Registry) -> None:
    for definition in registry.values():
        if definition.id in _registered:
            continue
        shared_task(
            name=definition.id,
            bind=True,
            acks_late=True,
            reject_on_worker_lost=True,
            base=RunTask,
            soft_time_limit=int(definition.timeout.soft.total_seconds()),
            time_limit=int(definition.timeout.hard.total_seconds()) + HARD_LIMIT_GRACE_S,
            ignore_result=True,
        )(_traced(runner.on_message, "lumastra.run", definition.id, definition.resource_class))
        _registered.add(definition.id)
        for stage in definition.pipeline:
            _register_stage(definition, stage)


def _traced(
    body: Body, name: str, task_id: str, resource_class: str, stage: str | None = None
) -> Body:
    """`body` as registered: traced, run in the spans of its message (`tracing.received`);
    untraced, itself (a message then runs nothing of tracing's)."""
    if not tracing.ON:
        return body

    @functools.wraps(body)  # Celery checks a message's arguments against its signature
    def traced(task: Task[Any, Any], run_id: str, *args: Any, **kwargs: Any) -> None:
        about = tracing.about(run_id, task_id, resource_class, instance_id(), stage)
        with tracing.received(task.request, name, about):
            body(task, run_id, *args, **kwargs)

    return cast(Body, traced)


def _register_stage(definition: TaskDefinition, stage: Stage) -> None:
    task_id, stage_name = definition.id, stage.name
    timeout = stage.timeout or definition.timeout

    def body(task: Task[Any, Any], run_id: str, processing_version: int) -> None:
        stage_attempts.run_stage_message(task_id, stage_name, run_id, processing_version)

    traced = _traced(body, "lumastra.stage", task_id, stage_class(definition, stage), stage_name)
    shared_task(
        name=stage_task_name(task_id, stage_name),
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        base=RunTask,
        soft_time_limit=int(timeout.soft.total_seconds()),
        time_limit=int(timeout.hard.total_seconds()) + HARD_LIMIT_GRACE_S,
        ignore_result=True,
    )(traced)
