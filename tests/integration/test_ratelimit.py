"""quotas.rate holds across worker processes; the sliding-window limiter's arithmetic on Valkey."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings

from orchestrator.hooks import ratelimit
from orchestrator.hooks.base import Pickup, Postpone, run_alone
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.task_defs import RATED_KEY

pytestmark = [pytest.mark.django_db(transaction=True)]

WINDOW = "test:rate-window"


def _server_ms() -> int:
    seconds, micros = valkey.client().time()
    return int(seconds) * 1000 + int(micros) // 1000


def _most_in_any_window(times: list[float], length: float) -> int:
    """The most of `times` inside any half-open interval [t, t + length)."""
    ordered = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(ordered):
        while ordered[first] <= at - length:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_most_in_any_window() -> None:
    assert _most_in_any_window([0, 999, 1000, 1999], 1000) == 2
    assert _most_in_any_window([0, 1, 2, 1000], 1000) == 3


def _take(member: str, count: int, per_ms: int) -> int:
    return int(valkey.script("rate_take", [WINDOW], [member, count, per_ms]))


def test_the_window_admits_count_then_waits_for_the_oldest_to_leave() -> None:
    client = valkey.client()
    client.delete(WINDOW)
    now = _server_ms()
    client.zadd(WINDOW, {"old": now - 900, "mid": now - 500, "new": now - 100})

    wait = _take("next", 3, 1_000)

    # "old" leaves the window 1000 ms after its admission, about 100 ms from now.
    assert 0 < wait <= 100
    assert _take("next", 4, 1_000) == 0, "a fourth place admits"
    assert _take("next", 4, 1_000) == 0, "the same member is not admitted twice"
    assert client.zcard(WINDOW) == 4


def test_a_lowered_count_waits_until_enough_admissions_have_left() -> None:
    client = valkey.client()
    client.delete(WINDOW)
    now = _server_ms()
    client.zadd(WINDOW, {"old": now - 900, "mid": now - 500, "new": now - 100})

    # Two must leave before one of two places is free: "mid" leaves in about 500 ms.
    assert 400 < _take("next", 2, 1_000) <= 500


def test_admissions_older_than_the_window_are_dropped() -> None:
    client = valkey.client()
    client.delete(WINDOW)
    now = _server_ms()
    client.zadd(WINDOW, {"gone": now - 1_000, "gone too": now - 5_000})

    assert _take("next", 1, 1_000) == 0
    assert client.zrange(WINDOW, 0, -1) == ["next"]
    assert 0 < client.pttl(WINDOW) <= 1_000, "the log expires with its last admission"


def test_a_released_admission_frees_its_place_and_postpones_exactly() -> None:
    definition = registry.get()["test-rated"]
    client = valkey.client()
    client.delete(keys.rate_window("test-rated"))
    hook = ratelimit.RateLimit()
    pickups = [Pickup(definition, f"run_{index}", "owner") for index in range(11)]
    for pickup in pickups[:10]:
        run_alone(hook.plan_before_claim(pickup))

    with pytest.raises(Postpone) as waited:
        run_alone(hook.plan_before_claim(pickups[10]))
    assert timedelta(0) < waited.value.delay <= timedelta(seconds=1)
    assert "rate of 10/s" in waited.value.reason

    hook.release(pickups[3])
    run_alone(hook.plan_before_claim(pickups[10]))
    assert client.zcard(keys.rate_window("test-rated")) == 10


def test_a_task_without_a_rate_writes_nothing() -> None:
    noop = registry.get()["test-noop"]
    run_alone(ratelimit.RateLimit().plan_before_claim(Pickup(noop, "run_free", "owner")))

    assert not valkey.client().exists(keys.rate_window("test-noop"))


@pytest.mark.worker
def test_the_rate_holds_across_two_workers() -> None:
    definition = registry.get()["test-rated"]
    rate = definition.quotas.parsed_rate()
    assert rate is not None
    per_ms = rate.per.total_seconds() * 1000
    client = valkey.client()
    client.delete(keys.rate_window("test-rated"), RATED_KEY)
    queue = queue_name(definition, settings.CONFIG.per_task_queues)
    runs = 30

    with (
        worker_process([queue], concurrency=2, name="rated-a") as first,
        worker_process([queue], concurrency=2, name="rated-b") as second,
    ):
        # Both workers are up before the first start, so both take part from the beginning.
        for index in range(runs):
            start_run("test-rated", {"label": f"r{index}"}, trigger=TriggerKind.MANUAL)
        wait_for(
            lambda: (
                TaskHistory.objects.filter(task_id="test-rated", state=RunState.COMPLETED).count()
                == runs
            ),
            timeout=120,
        )

    records = [json.loads(entry) for entry in client.lrange(RATED_KEY, 0, -1)]
    assert len(records) == runs
    assert {record["worker"] for record in records} == {first.pid, second.pid}
    admitted = [record["admitted_ms"] for record in records]
    started = [record["started_ms"] for record in records]
    # The limiter's own admission times, on Valkey's clock: strictly within the rate.
    assert _most_in_any_window(admitted, per_ms) == rate.count
    # 30 runs at 10 per second need at least two full windows after the first admission.
    assert max(admitted) - min(admitted) >= (runs // rate.count - 1) * per_ms
    # Handlers start a little after their admission (the claim, the Postgres write). Each
    # start is at most `lag` after its admission, so any interval of length per - lag holds
    # starts of admissions from one interval of length per: never more than the count.
    lag = max(s - a for s, a in zip(started, admitted, strict=True))
    assert 0 <= lag < per_ms
    assert _most_in_any_window(started, per_ms - lag) <= rate.count
