"""Queues and pools: where a task's messages wait, which worker pool consumes them, and the
cap on what may wait per resource class (`class_limit`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache

from django.conf import settings

from tasks import registry
from tasks.definition import TaskDefinition
from tasks.pipeline import Stage
from tasks.resources import Budget, budgets

# With per-task queues, small classes share a bigger pool's processes (summed budgets).
_FOLDED_INTO = {"ingest": "io", "bulk": "io", "analysis": "cpu"}


def queue_name(definition: TaskDefinition, per_task_queues: bool) -> str:
    return task_queue(definition.id, definition.resource_class, per_task_queues)


@cache
def task_queue(task_id: str, resource_class: str, per_task_queues: bool) -> str:
    """A task's queue by its parts, kept once made: every start's publish asks for it."""
    # Dots, not colons: kombu's Redis transport uses a separator for priority sub-queues.
    if per_task_queues:
        return f"task.t.{task_id}"
    return f"task.{resource_class}"


def stage_queue(definition: TaskDefinition, stage: Stage, per_task_queues: bool) -> str:
    """A stage of the task's own class waits in the task's queue; a stage of another class in
    a queue of its own (per-task queues) or its class's queue, so its class's pool takes it."""
    resource_class = stage_class(definition, stage)
    if resource_class == definition.resource_class:
        return queue_name(definition, per_task_queues)
    if per_task_queues:
        return f"task.t.{definition.id}.{stage.name}"
    return f"task.{resource_class}"


def stage_class(definition: TaskDefinition, stage: Stage) -> str:
    return stage.resource_class or definition.resource_class


def _queues_by_class(
    definitions: Iterable[TaskDefinition], per_task_queues: bool
) -> Iterator[tuple[str, str]]:
    """(resource class, queue) of every task's queue and of every stage queue of its own."""
    for definition in definitions:
        yield definition.resource_class, queue_name(definition, per_task_queues)
        for stage in definition.pipeline:
            yield stage_class(definition, stage), stage_queue(definition, stage, per_task_queues)


def pool_of(resource_class: str, per_task_queues: bool) -> str:
    return _FOLDED_INTO.get(resource_class, resource_class) if per_task_queues else resource_class


@dataclass(frozen=True)
class Pool:
    name: str
    concurrency: int
    queues: tuple[str, ...]


def plan_pools(
    definitions: Iterable[TaskDefinition],
    budgets: Mapping[str, Budget],
    per_task_queues: bool,
) -> list[Pool]:
    """One pool per class (after folding) that has at least one task to consume."""
    concurrency: dict[str, int] = {}
    for resource_class, budget in budgets.items():
        pool = pool_of(resource_class, per_task_queues)
        concurrency[pool] = concurrency.get(pool, 0) + budget.concurrency
    queues: dict[str, set[str]] = {}
    for resource_class, queue in _queues_by_class(definitions, per_task_queues):
        queues.setdefault(pool_of(resource_class, per_task_queues), set()).add(queue)
    return [
        Pool(name, concurrency[name], tuple(sorted(pool_queues)))
        for name, pool_queues in sorted(queues.items())
    ]


def class_queues(
    definitions: Iterable[TaskDefinition], resource_class: str, per_task_queues: bool
) -> list[str]:
    """Every queue whose messages count toward `resource_class`'s depth."""
    return sorted(
        {
            queue
            for queue_class, queue in _queues_by_class(definitions, per_task_queues)
            if queue_class == resource_class
        }
    )


@dataclass(frozen=True)
class ClassLimit:
    cap: int  # LUMASTRA_QUEUE_DEPTH_CAP_<CLASS> or the class's default
    queues: tuple[str, ...]  # every queue whose messages count toward the class's depth


# Computed once per (configuration, registry) rather than on every start: both are replaced,
# never changed in place (settings at startup or by a test; the registry once at startup).
_limits: tuple[object, object, dict[str, ClassLimit]] | None = None


def class_limit(resource_class: str) -> ClassLimit:
    """The cap and the queues a start of `resource_class` is judged by."""
    global _limits
    config, tasks = settings.CONFIG, registry.get()
    known = _limits
    if known is None or known[0] is not config or known[1] is not tasks:
        caps = budgets(config.concurrency_overrides, config.queue_depth_cap_overrides)
        known = _limits = (
            config,
            tasks,
            {
                name: ClassLimit(
                    budget.queue_depth_cap,
                    tuple(class_queues(tasks.values(), name, config.per_task_queues)),
                )
                for name, budget in caps.items()
            },
        )
    return known[2][resource_class]
