"""The delay a run waits for a concurrency slot: growth, caps by place in line, jitter."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from orchestrator.hooks.concurrency import backoff


class _Extreme(random.Random):
    """Jitter pinned to one end of its range."""

    def __init__(self, high: bool) -> None:
        super().__init__(0)
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


NO_JITTER_LOW, NO_JITTER_HIGH = _Extreme(high=False), _Extreme(high=True)


def _seconds(postponements: int, rank: int, limit: int = 2) -> float:
    low = backoff(postponements, rank, limit, NO_JITTER_LOW).total_seconds()
    high = backoff(postponements, rank, limit, NO_JITTER_HIGH).total_seconds()
    assert high == pytest.approx(low / 0.8 * 1.2)
    return low / 0.8


def test_behind_the_front_the_delay_grows_by_half_up_to_three_seconds() -> None:
    delays = [_seconds(n, rank=5) for n in range(1, 9)]

    assert delays[:5] == pytest.approx([0.5, 0.75, 1.125, 1.6875, 2.53125])
    assert delays[5:] == pytest.approx([3.0, 3.0, 3.0])


def test_at_the_front_the_delay_stops_growing_at_one_second() -> None:
    assert [_seconds(n, rank=1) for n in (1, 2, 3, 10)] == pytest.approx([0.5, 0.75, 1.0, 1.0])


def test_the_front_is_as_long_as_the_limit() -> None:
    assert _seconds(10, rank=2, limit=3) == pytest.approx(1.0)
    assert _seconds(10, rank=3, limit=3) == pytest.approx(3.0)


def test_jitter_stays_within_a_fifth_either_way() -> None:
    rng = random.Random(7)
    delays = [backoff(1, 0, 1, rng) for _ in range(200)]

    assert all(timedelta(seconds=0.4) <= d <= timedelta(seconds=0.6) for d in delays)
    assert len(set(delays)) > 100, "waiters do not come back in step"
