"""Every growing delay of the engine stays finite and capped for any step count."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from orchestrator.backoff import exponential, jittered_backoff
from orchestrator.hooks import concurrency
from tasks import Retry, define_task

SECOND = timedelta(seconds=1)


def test_grows_by_the_factor_until_the_cap() -> None:
    delays = [exponential(SECOND, 2, step, 10 * SECOND) for step in range(6)]

    assert delays == [SECOND, 2 * SECOND, 4 * SECOND, 8 * SECOND, 10 * SECOND, 10 * SECOND]


@pytest.mark.parametrize("step", [82, 1_000, 10_000, 10**9])
def test_a_huge_step_count_returns_the_cap_without_overflowing(step: int) -> None:
    assert exponential(timedelta(milliseconds=500), 1.5, step, 3 * SECOND) == 3 * SECOND


def test_a_negative_step_is_the_base_and_a_base_above_the_cap_is_the_cap() -> None:
    assert exponential(SECOND, 2, -5, 10 * SECOND) == SECOND
    assert exponential(20 * SECOND, 2, 3, 10 * SECOND) == 10 * SECOND


@pytest.mark.parametrize("postponements", [81, 82, 5_000, 1_000_000])
def test_a_run_postponed_thousands_of_times_still_gets_a_delay(postponements: int) -> None:
    delay = concurrency.backoff(postponements, rank=50, limit=8, rng=random.Random(1))

    assert concurrency.MAX_DELAY * 0.8 <= delay <= concurrency.MAX_DELAY * 1.2


def test_a_task_with_many_attempts_retries_within_its_cap() -> None:
    definition = define_task(
        id="many-attempts",
        resource_class="io",
        execute=lambda ctx, data: None,
        retry=Retry(max_attempts=10_000, base=2 * SECOND, cap=timedelta(minutes=5)),
    )

    delay = jittered_backoff(definition.retry, attempt=9_999)

    assert timedelta(minutes=2.5) <= delay <= timedelta(minutes=5)
