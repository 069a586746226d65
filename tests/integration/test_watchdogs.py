"""Heartbeats and watchdogs on a real worker, with thresholds compressed through settings."""

from __future__ import annotations

import pytest

from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, live, valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import stall_fail_everywhere, wait_for, worker_process
from tests.support.task_defs import SLEEPY_PIDS_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

FAST = {
    "LUMASTRA_HEARTBEAT_INTERVAL_S": "1",
    **stall_fail_everywhere(3),
}
QUEUES = ["task.t.test-sleepy", "task.t.test-hard-timeout"]


def _row(run_id: str) -> TaskHistory:
    return TaskHistory.objects.get(id=run_id)


def test_a_running_run_heartbeats_in_both_stores() -> None:
    with worker_process(QUEUES, concurrency=1, name="beat", env=FAST):
        handle = start_run("test-sleepy", {"seconds": 2.5}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _row(handle.run_id).state == "active")
        first = _row(handle.run_id).heartbeat_at
        wait_for(lambda: _row(handle.run_id).heartbeat_at != first, timeout=5)
        beat = valkey.client().hget(keys.run_active(handle.run_id), "heartbeat_at")
        wait_for(lambda: _row(handle.run_id).state == "completed", timeout=10)

    assert beat is not None
    assert _row(handle.run_id).heartbeat_at > first


def test_a_run_without_progress_fails_as_stalled() -> None:
    with worker_process(QUEUES, concurrency=1, name="stall", env=FAST):
        wedged = start_run(
            "test-sleepy",
            {"seconds": 60, "cooperative": False, "progress": False},
            trigger=TriggerKind.MANUAL,
        )
        wait_for(lambda: _row(wedged.run_id).state == "failed", timeout=15)

    row = _row(wedged.run_id)
    assert row.error["kind"] == "stalled"
    assert live.read(wedged.run_id)["state"] == "failed"
    assert valkey.client().hexists(SLEEPY_PIDS_KEY, wedged.run_id)


def test_the_hard_timeout_stops_a_handler_that_keeps_yielding() -> None:
    with worker_process(QUEUES, concurrency=1, name="hard", env=FAST):
        busy = start_run("test-hard-timeout", {}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _row(busy.run_id).state == "failed", timeout=20)

    row = _row(busy.run_id)
    assert row.error["kind"] == "timeout"
    assert "hard timeout" in row.error["message"]
    assert row.duration_s is not None and 2.5 < row.duration_s < 10


def test_a_claim_postgres_lost_is_taken_again_at_the_next_heartbeat() -> None:
    patient = {**FAST, **stall_fail_everywhere(20)}
    with worker_process(QUEUES, concurrency=1, name="retake", env=patient):
        handle = start_run("test-sleepy", {"seconds": 4}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _row(handle.run_id).state == "active")
        owner = _row(handle.run_id).owner_instance_id
        # What a crash of Postgres leaves when it loses the claim's commit (the claim does
        # not wait for its WAL flush): the row as before the claim, Valkey still claimed.
        TaskHistory.objects.filter(id=handle.run_id).update(
            state="pending", owner_instance_id="", attempts=0
        )
        wait_for(lambda: _row(handle.run_id).state == "active", timeout=5)
        assert _row(handle.run_id).owner_instance_id == owner
        wait_for(lambda: _row(handle.run_id).state == "completed", timeout=10)

    assert _row(handle.run_id).attempts == 1


def test_a_watchdog_ends_a_run_whose_claim_postgres_lost() -> None:
    # No heartbeat before the hard timeout: the watchdog's end alone must take the lost claim.
    no_beat = {**FAST, "LUMASTRA_HEARTBEAT_INTERVAL_S": "60"}
    with worker_process(QUEUES, concurrency=1, name="lost-hard", env=no_beat):
        busy = start_run("test-hard-timeout", {}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _row(busy.run_id).state == "active")
        owner = _row(busy.run_id).owner_instance_id
        TaskHistory.objects.filter(id=busy.run_id).update(
            state="pending", owner_instance_id="", attempts=0
        )
        wait_for(lambda: _row(busy.run_id).state == "failed", timeout=20)

    row = _row(busy.run_id)
    assert row.error["kind"] == "timeout"
    assert (row.owner_instance_id, row.attempts) == (owner, 1)


def test_a_task_sets_its_own_stall_limits_or_counts_a_running_handler_alive() -> None:
    queues = ["task.t.test-sleepy-strict", "task.t.test-sleepy-auto"]
    # The worker's own limits here are long: only the tasks' settings can act within the test.
    patient = {
        **FAST,
        **stall_fail_everywhere(120),
    }
    deaf = {"seconds": 5, "cooperative": False, "progress": False}
    with worker_process(queues, concurrency=2, name="stall-own", env=patient):
        strict = start_run("test-sleepy-strict", deaf, trigger=TriggerKind.MANUAL)
        auto = start_run(
            "test-sleepy-auto",
            {**deaf, "seconds": 4},
            trigger=TriggerKind.MANUAL,
        )
        wait_for(lambda: _row(strict.run_id).state == RunState.FAILED, timeout=15)
        wait_for(lambda: _row(auto.run_id).state == RunState.COMPLETED, timeout=20)

    assert _row(strict.run_id).error["kind"] == "stalled"


@pytest.mark.parametrize("valkey_left", ["nothing", "a pending hash"])
def test_a_claim_valkey_lost_is_claimed_again_while_postgres_holds_the_run(
    valkey_left: str,
) -> None:
    # What a Valkey restart without persistence leaves under a running handler: its hash gone,
    # or seeded again as pending by the reconciler (Postgres had not heard of the claim yet, a
    # short run's first second). Stopped, it would run again with this attempt uncounted.
    patient = {**FAST, **stall_fail_everywhere(20)}
    with worker_process(QUEUES, concurrency=1, name="reclaim", env=patient):
        handle = start_run("test-sleepy", {"seconds": 3}, trigger=TriggerKind.MANUAL)
        run_id = handle.run_id
        wait_for(lambda: valkey.client().hexists(SLEEPY_PIDS_KEY, run_id), timeout=10)
        owner = live.read(run_id)["owner"]
        valkey.client().delete(keys.run_active(run_id))
        if valkey_left == "a pending hash":
            # As the reconciler's pending check leaves it: marked, so nobody else claims it.
            live.reseed(run_id, "test-sleepy", 5, ())
        wait_for(lambda: _row(run_id).state == "completed", timeout=15)

    row = _row(run_id)
    assert (row.owner_instance_id, row.attempts) == (owner, 1)
    assert live.read(run_id)["state"] == "completed"
    assert not valkey.client().exists(keys.run_reseeded(run_id))
