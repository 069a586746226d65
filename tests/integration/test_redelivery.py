"""A redelivered message of a live run: dropped while its owner lives; when its owner is dead,
the run goes back to pending for its next attempt (`runs.put_back`) while it has attempts and
its task allows it, else ends as worker_lost; given up after too many redeliveries.

The runner is called in this process, as a worker's pool child would call it for a message
kombu restored (`redelivered`)."""

from __future__ import annotations

import socket
import subprocess
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from orchestrator.cluster.instance import instance_id
from orchestrator.models import TaskHistory
from orchestrator.recovery.pending import in_broker_lists
from orchestrator.runs import put_back, terminal
from orchestrator.runs.runner import run_message
from orchestrator.runs.start import start_run
from orchestrator.states import IllegalTransition, RunState
from orchestrator.stores import durable, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.errors import ErrorKind
from tests.support.fixtures import wait_for
from tests.support.messages import empty_queues

pytestmark = [pytest.mark.django_db(transaction=True)]


def _active(owner: str, task_id: str = "test-sleepy", attempts: int = 1) -> str:
    run_id = start_run(task_id, {"seconds": 0.2}, trigger=TriggerKind.MANUAL).run_id
    _queue_cleared(task_id)
    live.claim(run_id, owner, live.NO_PAUSE)
    TaskHistory.objects.filter(id=run_id).update(
        state="active",
        owner_instance_id=owner,
        started_at=Now(),
        heartbeat_at=Now(),
        attempts=attempts,
    )
    return run_id


def _queue_cleared(task_id: str) -> None:
    """The start's own message taken out (as a worker would have), so what is found in the
    queue afterwards is what the redelivery published."""
    empty_queues(f"task.t.{task_id}")


def _queued(task_id: str) -> set[str]:
    return in_broker_lists({f"task.t.{task_id}"})


def _dead_owner() -> str:
    """An instance id of this host whose process has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return f"{socket.gethostname()}:{process.pid}:deadbeef"


def test_a_redelivery_of_a_live_owners_run_is_dropped() -> None:
    run_id = _active(instance_id())

    run_message("test-sleepy", run_id, 1, redelivered=True)

    assert TaskHistory.objects.get(id=run_id).state == "active"
    assert live.read(run_id)["state"] == "active"


def test_a_redelivery_of_a_dead_owners_run_puts_it_back_for_its_next_attempt() -> None:
    dead = _dead_owner()
    run_id = _active(dead)

    run_message("test-sleepy", run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "pending" and row.owner_instance_id == "" and row.attempts == 1
    assert row.error["kind"] == "worker_lost" and row.error["owner"] == dead
    assert "attempt 1 of 3; retrying in" in row.error["message"]
    # The backoff of a first retry (Retry's default base 2 s, jittered over its upper half).
    assert timezone.now() + timedelta(seconds=0.9) < row.not_before
    assert row.not_before < timezone.now() + timedelta(seconds=2.1)
    assert live.read(run_id)["state"] == "pending"
    assert run_id in _queued("test-sleepy")


def test_the_resumed_run_runs_again_as_the_same_run_and_completes() -> None:
    run_id = _active(_dead_owner(), task_id="test-resumable")
    run_message("test-resumable", run_id, 1, redelivered=True)
    wait_for(lambda: TaskHistory.objects.get(id=run_id).not_before < timezone.now(), 5)

    run_message("test-resumable", run_id, 1)

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts, row.error) == ("completed", 2, None)
    assert row.owner_instance_id == instance_id()
    assert live.read(run_id)["state"] == "completed"


def test_a_dead_owners_run_with_its_attempts_spent_ends_as_worker_lost() -> None:
    run_id = _active(_dead_owner(), attempts=3)

    run_message("test-sleepy", run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "failed" and row.error["kind"] == "worker_lost"
    assert "attempts exhausted: 3 of 3" in row.error["message"] and row.error["exhausted"]
    assert live.read(run_id)["state"] == "failed"


def test_a_task_that_opted_out_ends_as_worker_lost_at_once() -> None:
    run_id = _active(_dead_owner(), task_id="test-no-resume")

    run_message("test-no-resume", run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.error["kind"], row.attempts) == ("failed", "worker_lost", 1)
    assert run_id not in _queued("test-no-resume")


def test_a_redelivery_with_a_stale_heartbeat_is_left_to_the_reconciler() -> None:
    # Silent in Postgres, on another host: perhaps alive and cut off, so no new attempt yet.
    run_id = _active("another-host:1234:abcdefgh")
    _age_heartbeat(run_id)

    run_message("test-sleepy", run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id) == ("active", "another-host:1234:abcdefgh")


def test_a_redelivery_with_a_stale_heartbeat_and_no_attempt_left_ends_the_run() -> None:
    run_id = _active("another-host:1234:abcdefgh", attempts=3)
    _age_heartbeat(run_id)

    run_message("test-sleepy", run_id, 1, redelivered=True)

    assert TaskHistory.objects.get(id=run_id).error["kind"] == "worker_lost"


def test_the_lost_claims_late_writes_are_refused_once_the_run_is_claimed_anew() -> None:
    """Fencing: the old owner, alive after all, can neither end nor retry the run that a new
    attempt now runs; its heartbeat is fenced too."""
    old = "another-host:999:oldclaim"
    run_id = _active(old, task_id="test-resumable")
    definition = registry.get()["test-resumable"]
    lost = put_back.Lost(run_id, old, 1, TaskHistory.objects.get(id=run_id).identity, 5)
    assert put_back.put_back(definition, lost, ErrorKind.WORKER_LOST, "test")
    # Before the new claim: pending, not ours; the old owner's heartbeat hears "pending". Its
    # end naming the attempt it ran is refused too: the row keeps that attempt's count, so it
    # is no lost claim (end_run.sql).
    assert terminal.end(definition, run_id, old, RunState.COMPLETED) == RunState.PENDING
    assert terminal.end(definition, run_id, old, RunState.COMPLETED, attempt=1) == RunState.PENDING
    assert TaskHistory.objects.get(id=run_id).state == RunState.PENDING
    TaskHistory.objects.filter(id=run_id).update(not_before=None)
    new = "this-host:1:newclaim"
    live.claim(run_id, new, live.NO_PAUSE)
    assert durable.claim(run_id, new) is not None

    assert terminal.end(definition, run_id, old, RunState.COMPLETED) == RunState.ACTIVE
    with pytest.raises(IllegalTransition):
        durable.put_back(
            run_id, owner=old, attempts=1, error={"kind": "transient"}, not_before=timezone.now()
        )

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id, row.attempts) == ("active", new, 2)
    assert live.read(run_id)["owner"] == new
    beat = valkey.script("heartbeat_run", [keys.run_active(run_id)], [old, 60])
    assert beat[0] == "fenced"
    # The new owner ends it.
    assert terminal.end(definition, run_id, new, RunState.COMPLETED) == RunState.COMPLETED


def test_a_put_back_races_a_claim_and_writes_nothing() -> None:
    old = "another-host:999:oldclaim"
    run_id = _active(old, task_id="test-resumable")
    definition = registry.get()["test-resumable"]
    # Judged at attempt 1; meanwhile someone else claimed it (attempt 2).
    TaskHistory.objects.filter(id=run_id).update(attempts=2)

    lost = put_back.Lost(run_id, old, 1, "x", 5)
    assert not put_back.put_back(definition, lost, ErrorKind.WORKER_LOST, "test")
    assert TaskHistory.objects.get(id=run_id).state == "active"
    assert live.read(run_id)["state"] == "active"


def _age_heartbeat(run_id: str) -> None:
    with connection.cursor() as cursor:  # aged by the Postgres clock, as the runner judges
        cursor.execute(
            "UPDATE task_history SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            [run_id],
        )


def test_too_many_redeliveries_end_the_run() -> None:
    run_id = _active(instance_id())

    for _ in range(4):
        run_message("test-sleepy", run_id, 1, redelivered=True)
    assert TaskHistory.objects.get(id=run_id).state == "active"
    run_message("test-sleepy", run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "failed" and row.error["kind"] == "worker_lost"
    assert "redelivered 5 times" in row.error["message"]
