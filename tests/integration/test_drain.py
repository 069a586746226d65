"""The pending-write drain on real Postgres and Redis.

Transient failures are real: the test terminates the replayer's own Postgres backend
(pg_terminate_backend from another connection), or holds the run's row lock from another
connection so the replay's UPDATE runs into its lock timeout. Nothing of ours is patched.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import pytest
from django.db import connection, connections

from orchestrator.cluster.leaders import CLUSTER
from orchestrator.cluster.locks import LoopLock
from orchestrator.hooks import quotas
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.recovery import drain_poison, drain_replay
from orchestrator.recovery.drain_replay import MAX_ATTEMPTS
from orchestrator.runs import drain
from orchestrator.runs.drain import MAX_ENTRIES
from orchestrator.runs.start import new_run_id
from orchestrator.states import RunState
from orchestrator.stores import durable, keys, live, valkey
from tests.support.fixtures import database_url, wait_for
from tests.support.runs import clean_drain, seed_active

pytestmark = [pytest.mark.django_db(transaction=True)]

OWNER = "host-b:777:CAFEBABE"
TASK = "test-noop"
FINISHED_AT = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean() -> None:
    clean_drain(CLUSTER)


def _completed_fields() -> dict[str, object]:
    return {"result": {"ok": True, "n": 12345678901234567}, "finished_at": FINISHED_AT}


def _pending_entries() -> list[dict[str, object]]:
    return [json.loads(raw) for raw in valkey.client().lrange(keys.drain_pending(), 0, -1)]


def _counts(kind: str) -> int:
    quotas.rollup()  # the task has no daily cap: its counts reach the table by the rollup
    return sum(TaskQuotaUsage.objects.filter(task_id=TASK).values_list(kind, flat=True))


@contextmanager
def _other_connection() -> Iterator[Any]:
    """A second Postgres session (a cursor), not Django's; its transaction is rolled back."""
    other = psycopg2.connect(database_url())
    try:
        with other.cursor() as cursor:
            yield cursor
    finally:
        other.rollback()
        other.close()


def test_a_pushed_write_is_applied_then_settled() -> None:
    run_id = seed_active(OWNER)

    assert drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    assert TaskHistory.objects.get(id=run_id).state == "active"
    assert live.read(run_id)["state"] == "active"

    report = drain_replay.replay()

    assert report.applied == 1
    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "completed"
    assert row.result == {"ok": True, "n": 12345678901234567}
    assert row.finished_at == FINISHED_AT
    assert live.read(run_id)["state"] == "completed"
    assert _counts("completed") == 1
    assert drain.depth() == (0, 0)


def test_a_failed_write_keeps_its_error_kind() -> None:
    run_id = seed_active(OWNER)
    error = {"kind": "permanent", "message": "asked to fail"}
    drain.push(run_id, RunState.FAILED, {"error": error, "finished_at": FINISHED_AT}, OWNER)

    assert drain_replay.replay().applied == 1

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.error) == ("failed", error)
    assert _counts("failed") == 1


def test_a_write_that_had_landed_is_done_and_still_settled() -> None:
    # The UPDATE committed but its reply was lost: the writer pushed a write Postgres has.
    run_id = seed_active(OWNER)
    durable.end(run_id, RunState.COMPLETED, owner=OWNER, **_completed_fields())
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)

    report = drain_replay.replay()

    assert report.already == 1 and report.applied == 0
    assert live.read(run_id)["state"] == "completed"
    assert _counts("completed") == 1
    assert drain.depth() == (0, 0)


def test_the_same_end_written_by_someone_else_is_not_reported_twice() -> None:
    # A watchdog failed the run (and told the hooks) while the runner's failed write waited.
    run_id = seed_active(OWNER)
    stalled = {"kind": "stalled", "message": "no progress"}
    durable.end(run_id, RunState.FAILED, error=stalled, finished_at=FINISHED_AT, owner=OWNER)
    mine = {"kind": "permanent", "message": "asked to fail"}
    later = FINISHED_AT + timedelta(seconds=1)
    drain.push(run_id, RunState.FAILED, {"error": mine, "finished_at": later}, OWNER)

    report = drain_replay.replay()

    assert report.superseded == 1 and report.already == 0
    assert TaskHistory.objects.get(id=run_id).error == stalled
    assert _counts("failed") == 0


def test_a_cancel_that_raced_the_end_wins() -> None:
    run_id = seed_active(OWNER)
    durable.request_cancel(run_id)
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)

    report = drain_replay.replay()

    assert report.cancelled == 1
    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "cancelled"
    assert row.finished_at == FINISHED_AT
    assert live.read(run_id)["state"] == "cancelled"


def test_a_write_for_a_run_that_ended_otherwise_is_dropped() -> None:
    run_id = seed_active(OWNER)
    orphaned = {"kind": "orphaned", "message": "its worker stopped heartbeating"}
    durable.end(run_id, RunState.FAILED, error=orphaned, finished_at=FINISHED_AT)
    gone = new_run_id()
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    drain.push(gone, RunState.COMPLETED, _completed_fields(), OWNER)

    report = drain_replay.replay()

    assert report.superseded == 2
    assert TaskHistory.objects.get(id=run_id).error == orphaned
    assert drain.depth() == (0, 0)


def test_a_write_of_a_claim_put_back_and_claimed_anew_is_dropped() -> None:
    """Fenced by the claim that wrote it: OWNER's worker was judged lost, its run put back
    and claimed by another process (`runs.put_back`); OWNER's deferred end must not end it."""
    run_id = seed_active(OWNER)
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    TaskHistory.objects.filter(id=run_id).update(owner_instance_id="host-c:1:NEWCLAIM", attempts=2)

    report = drain_replay.replay()

    assert report.superseded == 1
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id) == ("active", "host-c:1:NEWCLAIM")


def test_the_drain_is_bounded() -> None:
    client = valkey.client()
    entry = drain.Entry("run_filler", "completed", {}, OWNER).to_json()
    pipe = client.pipeline(transaction=False)
    for _ in range(MAX_ENTRIES - 1):
        pipe.lpush(keys.drain_pending(), entry)
    pipe.execute()
    run_id = seed_active(OWNER)

    assert drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    assert not drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    assert client.llen(keys.drain_pending()) == MAX_ENTRIES


def test_push_refuses_what_the_terminal_write_does_not_take() -> None:
    with pytest.raises(ValueError, match="state"):
        drain.push("run_x", RunState.COMPLETED, {"state": "completed"}, OWNER)
    with pytest.raises(ValueError, match="colour"):
        drain.push("run_x", RunState.COMPLETED, {"colour": "blue"}, OWNER)
    assert drain.depth() == (0, 0)


def test_a_dropped_connection_is_retried_then_applied() -> None:
    run_id = seed_active(OWNER)
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with _other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        other.connection.commit()

    first = drain_replay.replay()

    assert first.retried == 1 and first.applied == 0
    assert [e["attempts"] for e in _pending_entries()] == [1]
    # The failed pass set a backoff: the next pass is not due yet.
    assert drain_replay.replay().backing_off

    second = drain_replay.replay(force=True)

    assert second.applied == 1
    assert TaskHistory.objects.get(id=run_id).state == "completed"
    assert live.read(run_id)["state"] == "completed"
    assert drain.depth() == (0, 0)
    assert not valkey.client().exists(keys.drain_backoff())


def test_an_entry_failing_ten_times_is_poisoned() -> None:
    run_id = seed_active(OWNER)
    other_run = seed_active(OWNER)
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    with _other_connection() as other:
        # Another transaction holds the run's row: every replay runs into its lock timeout.
        other.execute("SELECT 1 FROM task_history WHERE id = %s FOR UPDATE", [run_id])
        for attempt in range(1, MAX_ATTEMPTS):
            report = drain_replay.replay(force=True, lock_timeout=timedelta(milliseconds=50))
            assert report.retried == 1, attempt
            assert [e["attempts"] for e in _pending_entries()] == [attempt]
        # A later entry for another run is not held up by the failing one for long.
        drain.push(other_run, RunState.COMPLETED, _completed_fields(), OWNER)
        last = drain_replay.replay(force=True, lock_timeout=timedelta(milliseconds=50))

    assert last.poisoned == 1
    assert TaskHistory.objects.get(id=run_id).state == "active"
    (poisoned,) = drain_poison.poisoned()
    assert poisoned.run_id == run_id
    assert poisoned.target == "completed"
    assert poisoned.attempts == MAX_ATTEMPTS
    assert "lock" in poisoned.error
    assert json.loads(poisoned.raw)["run_id"] == run_id
    assert drain.depth() == (1, 1)
    # Postgres answers again: the next entry goes through.
    assert drain_replay.replay(force=True).applied == 1
    assert TaskHistory.objects.get(id=other_run).state == "completed"


def test_an_unreadable_entry_is_poisoned_at_once() -> None:
    valkey.client().lpush(keys.drain_pending(), "{not json")

    report = drain_replay.replay()

    assert report.poisoned == 1
    (poisoned,) = drain_poison.poisoned()
    assert poisoned.raw == "{not json"
    assert poisoned.error.startswith("unreadable")


def test_an_entry_left_in_flight_by_a_dead_replayer_is_replayed() -> None:
    run_id = seed_active(OWNER)
    args = {"result": {"ok": True}, "finished_at": FINISHED_AT.isoformat()}
    entry = drain.Entry(run_id, "completed", args, OWNER).to_json()
    valkey.client().lpush(keys.drain_inflight(), entry)

    report = drain_replay.replay()

    assert report.recovered == 1 and report.applied == 1
    assert TaskHistory.objects.get(id=run_id).state == "completed"
    assert drain.depth() == (0, 0)


def test_one_replayer_at_a_time() -> None:
    run_id = seed_active(OWNER)
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    holder = LoopLock(CLUSTER, timedelta(seconds=30))
    assert holder.hold()

    assert drain_replay.replay().busy
    assert TaskHistory.objects.get(id=run_id).state == "active"

    holder.release()
    assert drain_replay.replay().applied == 1


def test_one_pass_at_a_time_in_a_process() -> None:
    """The drain loop and the reconciler's tick both replay under the leader's seat, in one
    process: a pass started beside another is busy, and leaves the other's entry in flight
    (it would put it back and apply it too)."""
    run_id = seed_active(OWNER)
    drain.push(run_id, RunState.COMPLETED, _completed_fields(), OWNER)
    seat = LoopLock(CLUSTER, timedelta(seconds=30))
    assert seat.hold()
    reports: list[drain_replay.ReplayReport] = []

    def first_pass() -> None:
        try:
            reports.append(drain_replay.replay(fence=seat, lock_timeout=timedelta(seconds=20)))
        finally:
            connections.close_all()

    with _other_connection() as other:
        # Another transaction holds the run's row: the first pass waits on it mid-entry.
        other.execute("SELECT 1 FROM task_history WHERE id = %s FOR UPDATE", [run_id])
        thread = threading.Thread(target=first_pass)
        thread.start()
        wait_for(lambda: valkey.client().llen(keys.drain_inflight()) == 1)

        second = drain_replay.replay(fence=seat)

        assert second.busy and second.recovered == 0
        assert valkey.client().llen(keys.drain_inflight()) == 1
    thread.join(timeout=30)
    seat.release()
    assert [r.applied for r in reports] == [1]
    assert TaskHistory.objects.get(id=run_id).state == "completed"
    assert drain.depth() == (0, 0)


def test_an_empty_drain_costs_no_query() -> None:
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        report = drain_replay.replay()

    assert report.done == 0
    assert queries.captured_queries == []


def test_the_replay_is_the_writers_own_call_and_closes_a_pipelines_stages() -> None:
    run_id = seed_active(OWNER)
    TaskHistory.objects.filter(id=run_id).update(stages={"a": "completed", "b": "waiting"})
    step = {"warnings": ["late"], "cost": {"gpu_s": 2}}
    args = {"finished_at": FINISHED_AT, "error": {"kind": "permanent", "message": "x"}}
    drain.push(run_id, RunState.FAILED, {**args, "step": step, "attempt": 1}, OWNER)

    (entry,) = _pending_entries()
    assert (entry["call"], entry["target"], entry["owner"]) == ("end", "failed", OWNER)
    assert entry["args"]["step"] == step and entry["args"]["attempt"] == 1
    assert drain_replay.replay().applied == 1

    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "failed"
    assert row.stages == {"a": "completed", "b": "skipped"}
    assert row.steps[TASK]["warnings"] == ["late"]
    assert row.cost_breakdown == {"gpu_s": 2}


def test_a_lost_claims_deferred_end_is_replayed_with_its_attempt() -> None:
    """Postgres lost the claim (its commit does not wait for the flush) and was away at the
    end: the replay still takes the claim with it, as the writer's call would have."""
    run_id = seed_active(OWNER)
    TaskHistory.objects.filter(id=run_id).update(
        state="pending", owner_instance_id="", started_at=None, heartbeat_at=None, attempts=0
    )
    drain.push(run_id, RunState.COMPLETED, {**_completed_fields(), "attempt": 1}, OWNER)

    assert drain_replay.replay().applied == 1

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id, row.attempts) == ("completed", OWNER, 1)
    assert live.read(run_id)["state"] == "completed"
