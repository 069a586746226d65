"""Resource classes: default budgets per machine size, default run limits per class, and the
operator's overrides."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from lumastra import config
from tasks import Timeout, define_task
from tasks.resources import (
    RESOURCE_CLASSES,
    Budget,
    budgets,
    default_stall_fail_s,
    default_timeout,
)

FIXED_CONCURRENCY = {
    "ingest": 2,
    "embedding": 1,
    "maintenance": 1,
    "bulk": 3,
    "analysis": 1,
    "discovery": 1,
}
QUEUE_DEPTH_CAPS = {
    "cpu": 500,
    "io": 2_000,
    "ingest": 50_000,
    "embedding": 10_000,
    "maintenance": 100,
    "bulk": 2_000,
    "analysis": 500,
    "discovery": 10_000,
}


def test_the_classes() -> None:
    assert set(RESOURCE_CLASSES) == set(QUEUE_DEPTH_CAPS)


@pytest.mark.parametrize(
    ("cores", "cpu", "io"),
    [
        (1, 1, 4),  # cpu: floor(1/2)=0 → 1; io: 1 → 4
        (2, 1, 4),
        (4, 2, 4),
        (8, 4, 8),  # inside both clamps
        (16, 6, 12),  # cpu: 8 → 6; io: 16 → 12
        (64, 6, 12),
    ],
)
def test_default_budgets_by_core_count(cores: int, cpu: int, io: int) -> None:
    result = budgets({}, {}, cores=cores)

    assert set(result) == set(RESOURCE_CLASSES)
    assert result["cpu"].concurrency == cpu
    assert result["io"].concurrency == io
    for name, concurrency in FIXED_CONCURRENCY.items():
        assert result[name].concurrency == concurrency, name
    for name, cap in QUEUE_DEPTH_CAPS.items():
        assert result[name].queue_depth_cap == cap, name


def test_without_a_core_count_the_machine_is_asked() -> None:
    result = budgets({}, {})
    assert 1 <= result["cpu"].concurrency <= 6
    assert 4 <= result["io"].concurrency <= 12


def test_overrides_replace_only_what_they_name() -> None:
    result = budgets({"io": 20, "maintenance": 2}, {"bulk": 5_000}, cores=2)

    assert result["io"] == Budget(concurrency=20, queue_depth_cap=2_000)  # clamps do not apply
    assert result["maintenance"] == Budget(concurrency=2, queue_depth_cap=100)
    assert result["bulk"] == Budget(concurrency=3, queue_depth_cap=5_000)
    assert result["cpu"] == Budget(concurrency=1, queue_depth_cap=500)


def test_overrides_from_the_environment() -> None:
    loaded = config.load({"LUMASTRA_CONCURRENCY_CPU": "3", "LUMASTRA_QUEUE_DEPTH_CAP_IO": "50"})

    result = budgets(loaded.concurrency_overrides, loaded.queue_depth_cap_overrides, cores=64)

    assert result["cpu"].concurrency == 3
    assert result["io"] == Budget(concurrency=12, queue_depth_cap=50)


@pytest.mark.parametrize(
    ("concurrency", "caps"),
    [({"gpu": 2}, {}), ({}, {"gpu": 10}), ({"io": 2, "cpus": 1}, {})],
)
def test_an_override_of_an_unknown_class_is_an_error(
    concurrency: dict[str, int], caps: dict[str, int]
) -> None:
    with pytest.raises(ValueError, match="unknown resource classes"):
        budgets(concurrency, caps, cores=4)


def test_an_unknown_class_in_the_environment_is_an_error() -> None:
    loaded = config.load({"LUMASTRA_CONCURRENCY_GPU": "2"})

    with pytest.raises(ValueError, match="gpu"):
        budgets(loaded.concurrency_overrides, loaded.queue_depth_cap_overrides)


@pytest.mark.parametrize(
    ("concurrency", "caps"), [({"io": 0}, {}), ({"cpu": -1}, {}), ({}, {"bulk": 0})]
)
def test_an_override_below_one_is_an_error(
    concurrency: dict[str, int], caps: dict[str, int]
) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        budgets(concurrency, caps, cores=4)


# --- default limits per class -----------------------------------------------------------------


@pytest.fixture
def environment(settings: Any) -> Callable[[dict[str, str]], None]:
    def use(environ: dict[str, str]) -> None:
        settings.CONFIG = config.load(environ)

    return use


def test_each_class_has_its_own_limits(environment: Callable[[dict[str, str]], None]) -> None:
    environment({})

    assert default_timeout("cpu") == Timeout(soft=timedelta(minutes=55), hard=timedelta(hours=1))
    assert default_timeout("embedding").hard == timedelta(hours=4)
    assert default_stall_fail_s("io") == 600 and default_stall_fail_s("analysis") == 1800


def test_the_environment_sets_a_class_limit_in_seconds(
    environment: Callable[[dict[str, str]], None],
) -> None:
    environment({"LUMASTRA_HARD_TIMEOUT_S_IO": "60", "LUMASTRA_STALL_FAIL_S_CPU": "90"})

    # A short limit keeps a sixth of itself for the soft timeout.
    assert default_timeout("io") == Timeout(soft=timedelta(seconds=50), hard=timedelta(minutes=1))
    assert default_stall_fail_s("cpu") == 90
    assert default_timeout("cpu").hard == timedelta(hours=1)  # only what is named


def test_a_task_without_a_timeout_takes_its_class_s_and_its_own_wins(
    environment: Callable[[dict[str, str]], None],
) -> None:
    environment({"LUMASTRA_HARD_TIMEOUT_S_DISCOVERY": "7200"})
    own = Timeout(soft=timedelta(seconds=5), hard=timedelta(seconds=10))

    assert define_task(id="a-scan", resource_class="discovery", execute=_noop).timeout.hard == (
        timedelta(hours=2)
    )
    assert define_task(id="b-scan", resource_class="io", execute=_noop, timeout=own).timeout == own


def test_a_per_class_variable_of_an_unknown_class_stops_startup() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from orchestrator.apps import _refuse_unknown_classes

    with pytest.raises(ImproperlyConfigured, match=r"\['gpu'\]"):
        _refuse_unknown_classes(config.load({"LUMASTRA_STALL_FAIL_S_GPU": "60"}))
    _refuse_unknown_classes(config.load({"LUMASTRA_STALL_FAIL_S_CPU": "60"}))


def _noop(ctx: object, params: object) -> None:
    return None
