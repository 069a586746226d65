"""Cancellation: before pickup, cooperative while running, escalated to a kill, and retry."""

from __future__ import annotations

import time

import pytest

from orchestrator.models import TaskHistory
from orchestrator.runs.cancel import NotCancellable, UnknownRun, request_cancel
from orchestrator.runs.rerun import NotRetryable, rerun
from orchestrator.runs.start import start_run
from orchestrator.stores import broker, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.processes import alive
from tests.support.task_defs import SLEEPY_PIDS_KEY

pytestmark = [pytest.mark.django_db(transaction=True)]

QUEUE = "task.t.test-sleepy"
FAST = {"LUMASTRA_HEARTBEAT_INTERVAL_S": "1", "LUMASTRA_CANCEL_ESCALATE_S": "2"}


@pytest.fixture(autouse=True)
def _empty_queue() -> None:
    broker.client().delete(*(keys.broker_queue(QUEUE, s) for s in keys.BROKER_PRIORITY_STEPS))
    valkey.client().delete(SLEEPY_PIDS_KEY)


def _state(run_id: str) -> str:
    return TaskHistory.objects.get(id=run_id).state


def test_a_run_cancelled_before_pickup_ends_at_once_and_leaves_no_message() -> None:
    handle = start_run("test-sleepy", {"seconds": 5}, trigger=TriggerKind.MANUAL)
    assert broker.depth([QUEUE]) == 1

    assert request_cancel(handle.run_id, actor="ops") == "cancelled"

    row = TaskHistory.objects.get(id=handle.run_id)
    assert row.state == "cancelled" and row.error["kind"] == "cancelled"
    assert "ops" in row.error["message"]
    assert live.read(handle.run_id)["state"] == "cancelled"
    assert broker.depth([QUEUE]) == 0
    with pytest.raises(NotCancellable, match="already ended"):
        request_cancel(handle.run_id, actor="ops")
    with pytest.raises(UnknownRun):
        request_cancel("run_nope", actor="ops")


@pytest.mark.worker
def test_a_running_handler_stops_cooperatively() -> None:
    with worker_process([QUEUE], concurrency=1, name="cancel", env=FAST):
        handle = start_run("test-sleepy", {"seconds": 60}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: valkey.client().hexists(SLEEPY_PIDS_KEY, handle.run_id))
        asked = time.monotonic()

        assert request_cancel(handle.run_id, actor="ops") == "cancelling"
        assert live.read(handle.run_id)["state"] == "cancelling"
        wait_for(lambda: _state(handle.run_id) == "cancelled", timeout=10)
        # The channel tripped ctx.sleep well before the 2 s escalation would have.
        assert time.monotonic() - asked < 2
        assert alive(int(valkey.client().hget(SLEEPY_PIDS_KEY, handle.run_id)))  # not killed

    assert live.read(handle.run_id)["state"] == "cancelled"


@pytest.mark.worker
def test_a_deaf_handler_is_killed_after_the_escalation_delay() -> None:
    with worker_process([QUEUE], concurrency=1, name="escalate", env=FAST):
        deaf = start_run(
            "test-sleepy", {"seconds": 60, "cooperative": False}, trigger=TriggerKind.MANUAL
        )
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, deaf.run_id)))
        request_cancel(deaf.run_id, actor="ops")

        wait_for(lambda: _state(deaf.run_id) == "cancelled", timeout=15)
        wait_for(lambda: not alive(pid), timeout=10)
        # The pool replaced the killed child and keeps working.
        after = start_run("test-sleepy", {"seconds": 0}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _state(after.run_id) == "completed", timeout=20)

    assert live.read(deaf.run_id)["state"] == "cancelled"


def test_kill_now_ends_a_deaf_handler_without_waiting_for_the_escalation() -> None:
    slow_escalation = {**FAST, "LUMASTRA_CANCEL_ESCALATE_S": "60"}
    with worker_process([QUEUE], concurrency=1, name="kill-now", env=slow_escalation):
        deaf = start_run(
            "test-sleepy", {"seconds": 60, "cooperative": False}, trigger=TriggerKind.MANUAL
        )
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, deaf.run_id)))
        assert request_cancel(deaf.run_id, actor="ops") == "cancelling"
        time.sleep(1.5)
        assert _state(deaf.run_id) == "cancelling"  # the handler does not listen

        # Again, with kill: no 60 s wait.
        assert request_cancel(deaf.run_id, actor="ops", kill=True) == "cancelling"

        wait_for(lambda: _state(deaf.run_id) == "cancelled", timeout=10)
        wait_for(lambda: not alive(pid), timeout=10)

    assert live.read(deaf.run_id)["state"] == "cancelled"


def test_an_operator_retry_is_a_new_urgent_run_linked_to_the_original() -> None:
    original = start_run("test-sleepy", {"seconds": 1}, trigger=TriggerKind.MANUAL)
    with pytest.raises(NotRetryable, match="only failed or cancelled"):
        rerun(original.run_id, actor="ops")
    request_cancel(original.run_id, actor="ops")

    again = rerun(original.run_id, actor="ops")

    row = TaskHistory.objects.get(id=again.run_id)
    assert row.priority == 1
    assert row.trigger == {"kind": "operator-retry", "actor": "ops", "retryOf": original.run_id}
    assert row.input == TaskHistory.objects.get(id=original.run_id).input
    assert _state(original.run_id) == "cancelled"
