"""Resource classes: the worker pools tasks run in, with their default budgets."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@dataclass(frozen=True)
class ResourceClass:
    name: str
    # Concurrency from the number of cores; fixed classes ignore the argument.
    default_concurrency: Callable[[int], int]
    default_queue_depth_cap: int


RESOURCE_CLASSES: Mapping[str, ResourceClass] = {
    rc.name: rc
    for rc in (
        ResourceClass("cpu", lambda cores: _clamp(cores // 2, 1, 6), 500),
        ResourceClass("io", lambda cores: _clamp(cores, 4, 12), 2_000),
        ResourceClass("ingest", lambda _: 2, 50_000),
        ResourceClass("embedding", lambda _: 1, 10_000),
        ResourceClass("maintenance", lambda _: 1, 100),
        ResourceClass("bulk", lambda _: 3, 2_000),
        ResourceClass("analysis", lambda _: 1, 500),
        ResourceClass("discovery", lambda _: 1, 10_000),
    )
}


@dataclass(frozen=True)
class Budget:
    concurrency: int
    queue_depth_cap: int


def budgets(
    concurrency_overrides: Mapping[str, int],
    cap_overrides: Mapping[str, int],
    cores: int | None = None,
) -> dict[str, Budget]:
    """Each class's budget: its defaults on this machine, then the operator's overrides."""
    unknown = (set(concurrency_overrides) | set(cap_overrides)) - set(RESOURCE_CLASSES)
    if unknown:
        raise ValueError(f"overrides name unknown resource classes: {sorted(unknown)}")
    cores = cores or os.cpu_count() or 1
    result = {}
    for name, rc in RESOURCE_CLASSES.items():
        concurrency = concurrency_overrides.get(name, rc.default_concurrency(cores))
        cap = cap_overrides.get(name, rc.default_queue_depth_cap)
        if concurrency < 1 or cap < 1:
            raise ValueError(f"resource class {name!r}: concurrency and cap must be >= 1")
        result[name] = Budget(concurrency, cap)
    return result
