"""Pools: which worker processes consume which queues, with how many processes."""

from __future__ import annotations

import pytest

from lumastra.workers import worker_argv
from orchestrator.routing import Pool, plan_pools
from tasks import NoInput, TaskContext, TaskDefinition, define_task
from tasks.resources import RESOURCE_CLASSES, budgets

# Distinct budgets per class, so a sum shows exactly which classes went into a pool.
BUDGETS = budgets(
    {name: 2**index for index, name in enumerate(RESOURCE_CLASSES)},
    {},
)


def _noop(ctx: TaskContext, params: NoInput) -> None:
    return None


def _task(task_id: str, resource_class: str) -> TaskDefinition:
    return define_task(id=task_id, resource_class=resource_class, execute=_noop)


ONE_PER_CLASS = [_task(f"t-{name}", name) for name in RESOURCE_CLASSES]


def _by_name(pools: list[Pool]) -> dict[str, Pool]:
    return {pool.name: pool for pool in pools}


def test_per_task_queues_fold_ingest_and_bulk_into_io_and_analysis_into_cpu() -> None:
    pools = _by_name(plan_pools(ONE_PER_CLASS, BUDGETS, per_task_queues=True))

    assert set(pools) == {"cpu", "io", "embedding", "maintenance", "discovery"}
    io, cpu = pools["io"], pools["cpu"]
    assert io.queues == ("task.t.t-bulk", "task.t.t-ingest", "task.t.t-io")
    assert io.concurrency == sum(BUDGETS[c].concurrency for c in ("io", "ingest", "bulk"))
    assert cpu.queues == ("task.t.t-analysis", "task.t.t-cpu")
    assert cpu.concurrency == BUDGETS["cpu"].concurrency + BUDGETS["analysis"].concurrency
    assert pools["embedding"] == Pool(
        "embedding", BUDGETS["embedding"].concurrency, ("task.t.t-embedding",)
    )


def test_folding_sums_budgets_even_when_only_the_big_class_has_tasks() -> None:
    pools = _by_name(plan_pools([_task("only-io", "io")], BUDGETS, per_task_queues=True))

    assert pools == {
        "io": Pool(
            "io",
            sum(BUDGETS[c].concurrency for c in ("io", "ingest", "bulk")),
            ("task.t.only-io",),
        )
    }


def test_one_queue_per_class_without_folding_when_per_task_queues_are_off() -> None:
    tasks = [*ONE_PER_CLASS, _task("t-io-2", "io"), _task("t-bulk-2", "bulk")]

    pools = _by_name(plan_pools(tasks, BUDGETS, per_task_queues=False))

    assert set(pools) == set(RESOURCE_CLASSES)
    for name, pool in pools.items():
        assert pool.queues == (f"task.{name}",)
        assert pool.concurrency == BUDGETS[name].concurrency


@pytest.mark.parametrize("per_task_queues", [True, False])
def test_pools_without_tasks_are_not_started(per_task_queues: bool) -> None:
    tasks = [_task("hash", "cpu"), _task("prune", "maintenance")]

    pools = plan_pools(tasks, BUDGETS, per_task_queues)

    assert [pool.name for pool in pools] == ["cpu", "maintenance"]


def test_no_tasks_no_pools() -> None:
    assert plan_pools([], BUDGETS, per_task_queues=True) == []


def test_each_pool_runs_one_prefork_worker_with_its_budget_queues_and_name() -> None:
    argv = worker_argv("io@%h", 9, ("task.t.a", "task.t.b"), ["--loglevel=INFO"])

    assert argv[1:6] == ["-m", "celery", "-A", "lumastra", "worker"]
    options = argv[6:]
    assert "--pool=prefork" in options
    assert options[options.index("-c") + 1] == "9"
    assert options[options.index("-Q") + 1] == "task.t.a,task.t.b"
    # %h is Celery's own host-name placeholder: pools on different hosts get distinct names.
    assert options[options.index("-n") + 1] == "io@%h"
    assert options[-1] == "--loglevel=INFO"
