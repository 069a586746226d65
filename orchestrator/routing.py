"""Queues and pools: where a task's messages wait, and which worker pool consumes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tasks.definition import TaskDefinition
from tasks.resources import Budget

# With per-task queues, small classes share a bigger pool's processes (summed budgets).
_FOLDED_INTO = {"ingest": "io", "bulk": "io", "analysis": "cpu"}


def queue_name(definition: TaskDefinition, per_task_queues: bool) -> str:
    # Dots, not colons: kombu's Redis transport uses a separator for priority sub-queues.
    if per_task_queues:
        return f"task.t.{definition.id}"
    return f"task.{definition.resource_class}"


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
    for definition in definitions:
        pool = pool_of(definition.resource_class, per_task_queues)
        queues.setdefault(pool, set()).add(queue_name(definition, per_task_queues))
    return [
        Pool(name, concurrency[name], tuple(sorted(pool_queues)))
        for name, pool_queues in sorted(queues.items())
    ]


def class_queues(
    definitions: Iterable[TaskDefinition], resource_class: str, per_task_queues: bool
) -> list[str]:
    """Every queue whose messages count toward `resource_class`'s depth."""
    return sorted(
        {queue_name(d, per_task_queues) for d in definitions if d.resource_class == resource_class}
    )
