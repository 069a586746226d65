"""Pipeline stages of a task and their ordering (Kahn's algorithm).

A pipeline task declares stages instead of one `execute`: each stage is its own body, runs as
its own message on the pool of its resource class, and starts once every stage in its
`after` has completed (or was skipped). The engine advances the pipeline; see
`orchestrator/runs/pipeline.py`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tasks.policies import Retry, Timeout


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One step of a pipeline task.

    `execute(ctx, input)` does the work and may return a JSON-serialisable value, which later
    stages read as `ctx.results[name]`. `when(ctx)` (synchronous) is asked just before the
    stage would start: False skips it, and every stage that depends only on skipped stages.
    `resource_class`, `timeout` and `retry` default to the task's. With `await_children`, it
    starts only once every child run its `after` stages spawned (`ctx.spawn`) has ended,
    holding no worker meanwhile; it reads them with `ctx.children(name)`."""

    name: str
    execute: Callable[[Any, Any], object]
    after: tuple[str, ...] = ()
    when: Callable[[Any], bool] | None = None
    resource_class: str | None = None
    timeout: Timeout | None = None
    retry: Retry | None = None
    await_children: bool = False


class PipelineError(ValueError):
    pass


def stage_order(stages: Sequence[Stage]) -> list[str]:
    """Stage names in dependency order; rejects unknown deps, cycles, diamonds, async `when`."""
    by_name: dict[str, Stage] = {}
    for stage in stages:
        if not stage.name:
            raise PipelineError("a stage has an empty name")
        if stage.name in by_name:
            raise PipelineError(f"stage {stage.name!r} is declared twice")
        if not callable(stage.execute):
            raise PipelineError(f"stage {stage.name!r}: `execute` must be callable")
        if stage.await_children and not stage.after:
            raise PipelineError(
                f"stage {stage.name!r}: `await_children` needs the stages it waits for in `after`"
            )
        if isinstance(stage.after, str):
            raise PipelineError(f"stage {stage.name!r}: `after` must be a tuple of stage names")
        if stage.when is not None and (
            inspect.iscoroutinefunction(stage.when) or inspect.isasyncgenfunction(stage.when)
        ):
            raise PipelineError(f"stage {stage.name!r}: `when` must not be async")
        by_name[stage.name] = stage
    for stage in stages:
        for dep in stage.after:
            if dep not in by_name:
                raise PipelineError(f"stage {stage.name!r} depends on unknown stage {dep!r}")

    indegree = {name: len(set(stage.after)) for name, stage in by_name.items()}
    children: dict[str, list[str]] = {name: [] for name in by_name}
    for stage in stages:
        for dep in set(stage.after):
            children[dep].append(stage.name)
    ready = [name for name, degree in indegree.items() if degree == 0]
    ancestors: dict[str, set[str]] = {name: set() for name in by_name}
    order: list[str] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for child in children[name]:
            inherited = ancestors[name] | {name}
            if ancestors[child] & inherited:
                raise PipelineError(
                    f"stage {child!r} is reached along two paths (a diamond) through "
                    f"{sorted(ancestors[child] & inherited)}"
                )
            ancestors[child] |= inherited
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(order) != len(by_name):
        cyclic = sorted(name for name, degree in indegree.items() if degree > 0)
        raise PipelineError(f"stages form a cycle: {cyclic}")
    return order
