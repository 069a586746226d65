"""Keyed concurrency with turns between keys (issue 39): `Concurrency(key=..., max=...)` lets at
most `max` runs of one key run at once, the runs over it wait pending with no attempt spent and
without holding back other keys, and the keys take turns; a SIGKILLed holder frees its key.
Real workers; the order is read from the handlers' own record of when they began."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.runs import due
from orchestrator.runs.handle import InvalidInput, RunHandle
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.task_defs import KEYED_STARTS_KEY
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-keyed"  # key: the input's library, two at once per library, hard timeout 4 s
QUEUE = f"task.t.{TASK}"


def _forget() -> None:
    valkey.client().delete(KEYED_STARTS_KEY, *keys.keyed(TASK), *keys.keyed("test-keyed-bad-key"))


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    _forget()
    empty_queues(QUEUE)
    yield
    _forget()


def _calls() -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in valkey.client().lrange(KEYED_STARTS_KEY, 0, -1)]


def _start(library: str, n: int, seconds: float = 0.0) -> RunHandle:
    params = {"library": library, "n": n, "seconds": seconds}
    return start_run(TASK, params, trigger=TriggerKind.EVENT)


@pytest.mark.worker
def test_queued_keys_take_turns() -> None:
    # Recorded before any worker takes the queue: A,A,A,B,B,B,C,C,C.
    for library in "ABC":
        for n in range(3):
            _start(library, n, seconds=0.05)
    # One message per key in the broker: the first of each.
    assert valkey.client().hlen(keys.keyed(TASK)[4]) == 3
    with worker_process([QUEUE], concurrency=1, name="keyed-turns"):
        wait_for(lambda: len(_calls()) == 9, timeout=30)
    calls = _calls()
    assert [c["library"] for c in calls] == list("ABCABCABC")
    assert [c["n"] for c in calls] == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # within a key, oldest first
    assert TaskHistory.objects.filter(task_id=TASK, state="completed", attempts=1).count() == 9


@pytest.mark.worker
def test_a_full_key_waits_without_holding_back_another() -> None:
    with worker_process([QUEUE], concurrency=3, name="keyed-wait"):
        held = [_start("A", n, seconds=1.5) for n in range(2)]
        wait_for(lambda: len(_calls()) == 2, timeout=30)
        third = _start("A", 2)
        other = _start("B", 0)
        wait_for(lambda: any(c["library"] == "B" for c in _calls()), timeout=10)
        # B ran while A's third waited: pending, its attempt not spent, not failed.
        row = TaskHistory.objects.get(id=third.run_id)
        assert (row.state, row.attempts) == ("pending", 0)
        client = Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})
        hold = client.get(f"/api/v1/runs/{third.run_id}").json()["held"]
        assert (hold["by"], hold["name"]) == ("concurrency", "A")
        assert hold["says"] == "waits its turn: key 'A' runs its limit"
        wait_for(lambda: len(_calls()) == 4, timeout=30)
    calls = _calls()
    began = {c["run"]: c["at_ms"] for c in calls}
    assert began[third.run_id] >= min(began[h.run_id] for h in held) + 1400  # after a place freed
    assert began[other.run_id] < began[third.run_id]
    assert TaskHistory.objects.get(id=third.run_id).attempts == 1


@pytest.mark.worker
def test_a_killed_holder_frees_its_key() -> None:
    with worker_process([QUEUE], concurrency=3, name="keyed-kill"):
        holders = [_start("K", n, seconds=2.0) for n in range(2)]  # within the soft 3 s
        wait_for(lambda: len(_calls()) == 2, timeout=30)
        waiting = _start("K", 2)
        time.sleep(0.3)
        assert TaskHistory.objects.get(id=waiting.run_id).attempts == 0
        victim = next(c for c in _calls() if c["run"] == holders[0].run_id)
        killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: any(c["run"] == waiting.run_id for c in _calls()), timeout=30)
        # Within the lease (hard timeout 4 s + 10 s margin): the put back released it sooner.
        assert time.monotonic() - killed_at < 14
        wait_for(
            lambda: TaskHistory.objects.filter(task_id=TASK, state="completed").count() == 3,
            timeout=30,
        )
    victim_row = TaskHistory.objects.get(id=holders[0].run_id)
    assert victim_row.state == "completed" and victim_row.attempts == 2  # put back, run again


@pytest.mark.worker
def test_the_leaders_sweep_publishes_a_turn_whose_lease_ran_out() -> None:
    # Holders that vanished without a put back (their host lost): their leases run out, and
    # the sweep, not an end, gives the key's place to the waiting run.
    running = _start("L", 0)
    empty_queues(QUEUE)  # its message, as the lost host took it
    for owner in ("gone-host:1:X", "gone-host:2:X"):  # the key's two places, 50 ms leases
        taken = valkey.script(
            "keyed", keys.keyed(TASK), ["take", 2, 50, 60_000, running.run_id, owner]
        )
        assert taken[0] == 1
    waiting = _start("L", 1)
    assert valkey.client().hget(keys.keyed(TASK)[4], "L") is None  # not dispatched: L is full
    time.sleep(0.1)  # the leases run out
    assert due.release_turns() == 1
    with worker_process([QUEUE], concurrency=1, name="keyed-sweep"):
        wait_for(lambda: any(c["run"] == waiting.run_id for c in _calls()), timeout=30)


def test_a_key_function_that_fails_refuses_the_start_naming_the_field() -> None:
    with pytest.raises(InvalidInput) as refused:
        start_run("test-keyed-bad-key", {"library": "broken", "n": 1}, trigger=TriggerKind.EVENT)
    assert refused.value.errors[0]["loc"] == ["concurrency", "key"]
    assert "no such library" in refused.value.errors[0]["msg"]
    client = Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})
    answer = client.post(
        "/api/v1/runs",
        json.dumps({"task": "test-keyed-bad-key", "input": {"library": "broken", "n": 1}}),
        content_type="application/json",
    )
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"] == ["body", "run", "input", "concurrency", "key"]
    assert not TaskHistory.objects.filter(task_id="test-keyed-bad-key").exists()
    started = start_run(
        "test-keyed-bad-key", {"library": "fine", "n": 1}, trigger=TriggerKind.EVENT
    )
    row = TaskHistory.objects.get(id=started.run_id)
    assert row.trigger["concurrencyKey"] == "fine"


def _script(
    verb: str, *args: object, most: int = 1, lease_ms: int = 60_000, stale_ms: int = 60_000
) -> list[Any]:
    """One call of lua/keyed.lua on test-keyed's keys, with this call's max, lease and staleness."""
    return valkey.script("keyed", keys.keyed(TASK), [verb, most, lease_ms, stale_ms, *args])


def _enqueue(run_id: str, key: str, **limits: int) -> list[Any]:
    return _script("enqueue", run_id, key, 5, f"job-{run_id}", 1, **limits)


def test_a_turn_not_claimed_in_time_no_longer_holds_its_key() -> None:
    assert _enqueue("r1", "A")[1] == "r1"  # dispatched: its key's turn
    assert _enqueue("r2", "A") == [1]  # waits behind r1's turn
    time.sleep(0.01)
    assert _script("sweep", 10, stale_ms=5)[1] == "r2"  # r1's turn went stale: r2 goes


def test_the_sweep_resumes_after_the_last_key_it_looked_at() -> None:
    for key in "AB":
        _enqueue(f"{key}-holder", key)
        # Long enough that a busy machine does not see A's lease run out before A's second run
        # is registered (it would be dispatched at once, and the sweep would start at B).
        _script("take", f"{key}-holder", "gone-host:1:X", lease_ms=300)
        _enqueue(f"{key}-waits", key)
    time.sleep(0.35)  # the holders' leases run out
    assert _script("sweep", 1)[1::4] == ["A-waits"]
    assert _script("sweep", 1)[1::4] == ["B-waits"]  # not A again: it resumed after A


def test_an_end_frees_every_place_of_its_run_and_a_release_keeps_its_turn() -> None:
    _enqueue("r1", "K", most=2)
    for owner in ("one:1:X", "two:1:X"):  # two deliveries of one run, a place each
        assert _script("take", "r1", owner, most=2)[0] == 1
    _enqueue("r2", "K", most=2)
    assert _script("finish", "r1", "one:1:X", most=2)[1] == "r2"  # both places freed
    assert valkey.client().zcard(keys.keyed(TASK)[3]) == 0
    assert _script("take", "r2", "one:1:X")[0] == 1
    _enqueue("r3", "K")
    assert _script("release", "r2", "one:1:X") == [1]  # r3 not dispatched: r2's turn again
    assert valkey.client().hget(keys.keyed(TASK)[4], "K").split("\t")[0] == "r2"
