"""Pipeline stages of a task and their ordering (Kahn's algorithm)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stage:
    name: str
    depends_on: tuple[str, ...] = ()
    # Decides at run time whether the stage runs or is skipped; must be a plain function.
    when: Callable[[Any], bool] | None = None


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
        if stage.when is not None and (
            inspect.iscoroutinefunction(stage.when) or inspect.isasyncgenfunction(stage.when)
        ):
            raise PipelineError(f"stage {stage.name!r}: `when` must not be async")
        by_name[stage.name] = stage
    for stage in stages:
        for dep in stage.depends_on:
            if dep not in by_name:
                raise PipelineError(f"stage {stage.name!r} depends on unknown stage {dep!r}")

    indegree = {name: len(set(stage.depends_on)) for name, stage in by_name.items()}
    children: dict[str, list[str]] = {name: [] for name in by_name}
    for stage in stages:
        for dep in set(stage.depends_on):
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
