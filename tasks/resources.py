"""Resource classes: the worker pools tasks run in, with their default budgets and limits."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from tasks.policies import Timeout


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@dataclass(frozen=True)
class ResourceClass:
    name: str
    # Concurrency from the number of cores; fixed classes ignore the argument.
    default_concurrency: Callable[[int], int]
    default_queue_depth_cap: int
    # How long one run may take, and go without a sign of progress, unless its task says
    # (`define_task(timeout=, stall=)`) or the environment does (LUMASTRA_HARD_TIMEOUT_S_<CLASS>,
    # LUMASTRA_STALL_FAIL_S_<CLASS>): cpu and io work takes seconds to minutes, analysis,
    # embedding and discovery minutes to hours.
    default_hard_timeout_s: int
    default_stall_fail_s: int


_MINUTE, _HOUR = 60, 3600

RESOURCE_CLASSES: Mapping[str, ResourceClass] = {
    rc.name: rc
    for rc in (
        ResourceClass("cpu", lambda cores: _clamp(cores // 2, 1, 6), 500, _HOUR, 10 * _MINUTE),
        ResourceClass("io", lambda cores: _clamp(cores, 4, 12), 2_000, 30 * _MINUTE, 10 * _MINUTE),
        ResourceClass("ingest", lambda _: 2, 50_000, 30 * _MINUTE, 10 * _MINUTE),
        ResourceClass("embedding", lambda _: 1, 10_000, 4 * _HOUR, 30 * _MINUTE),
        ResourceClass("maintenance", lambda _: 1, 100, _HOUR, 15 * _MINUTE),
        ResourceClass("bulk", lambda _: 3, 2_000, _HOUR, 15 * _MINUTE),
        ResourceClass("analysis", lambda _: 1, 500, 4 * _HOUR, 30 * _MINUTE),
        ResourceClass("discovery", lambda _: 1, 10_000, 4 * _HOUR, 30 * _MINUTE),
    )
}
# The soft timeout comes this long before the hard one (a sixth of it for short limits): the
# handler's chance to clean up.
SOFT_MARGIN_S = 5 * _MINUTE
# A stall is warned of at this share of its fail window.
STALL_WARN_SHARE = 0.2


def default_timeout(resource_class: str) -> Timeout:
    """The class's timeout: its hard limit from the environment or the class, the soft one
    SOFT_MARGIN_S before it."""
    hard_s = settings.CONFIG.hard_timeout_overrides.get(
        resource_class, RESOURCE_CLASSES[resource_class].default_hard_timeout_s
    )
    soft_s = hard_s - min(SOFT_MARGIN_S, hard_s / 6)
    return Timeout(soft=timedelta(seconds=soft_s), hard=timedelta(seconds=hard_s))


def default_stall_fail_s(resource_class: str) -> float:
    """Seconds a run of the class may go without progress before it fails as stalled."""
    return float(
        settings.CONFIG.stall_fail_overrides.get(
            resource_class, RESOURCE_CLASSES[resource_class].default_stall_fail_s
        )
    )


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
    unknown = unknown_classes(concurrency_overrides, cap_overrides)
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


def unknown_classes(*overrides: Mapping[str, object]) -> set[str]:
    return set().union(*overrides) - set(RESOURCE_CLASSES)
