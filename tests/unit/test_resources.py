"""Resource classes: default budgets per machine size, and the operator's overrides."""

from __future__ import annotations

import pytest

from lumastra import config
from tasks.resources import RESOURCE_CLASSES, Budget, budgets

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
