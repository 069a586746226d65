"""The runner's claim of a first delivery (issues 9, 22): Valkey's claim, then a read of what
the run needs, its Postgres claim folded into its end (or written by the watch for a run still
going), and every refusal taken back in both stores before the row decides what the message
was.

The runner is called in this process, as a worker's pool child would call it."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import uuid
from contextlib import closing
from datetime import datetime, timedelta
from typing import Any

import psycopg2
import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestrator.hooks import dispatch
from orchestrator.hooks.base import Pickup
from orchestrator.hooks.concurrency import running
from orchestrator.models import TaskHistory, TaskHistoryAudit
from orchestrator.recovery.pending import in_broker_lists
from orchestrator.routing import queue_name
from orchestrator.runs import terminal
from orchestrator.runs.batch import start_runs
from orchestrator.runs.batches import StartRequest
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.publish import CARRY_MAX_CHARS
from orchestrator.runs.runner import run_message
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import broker, durable, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues, take_message

pytestmark = [pytest.mark.django_db(transaction=True)]

# test-noop without a worker on its queue: the shared worker would take the message first.
TASK = "test-rt-plain"
SLEEPY_QUEUE = "task.t.test-sleepy"


def _start() -> str:
    return start_run(TASK, {}, trigger=TriggerKind.MANUAL).run_id


def _statements_on_runs(captured: CaptureQueriesContext) -> list[str]:
    """The statements on task_history (as text or prepared), without their leading comments."""
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if "task_history" in q["sql"] or "EXECUTE lumastra_" in q["sql"]
    ]
    return [
        "\n".join(line for line in sql.splitlines() if not line.startswith("--")).strip()
        for sql in statements
    ]


def test_a_first_message_carries_the_row_and_its_pickup_reads_nothing() -> None:
    run_id = _start()
    args, kwargs = take_message(TASK, run_id)

    with CaptureQueriesContext(connection) as captured:
        run_message(TASK, *args, carried=kwargs["carried"])

    (end,) = _statements_on_runs(captured)
    assert end.startswith(("UPDATE task_history", "EXECUTE lumastra_end_run("))
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts, row.result) == ("completed", 1, {"ok": True})
    assert row.owner_instance_id == live.read(run_id)["owner"] != ""
    assert _moves(run_id) == [(None, "pending"), ("pending", "active"), ("active", "completed")]


def test_a_carried_run_postgres_lost_is_not_recorded_and_raises_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id = _start()
    args, kwargs = take_message(TASK, run_id)
    TaskHistory.objects.filter(id=run_id).delete()  # its row lost after its message went out

    run_message(TASK, *args, carried=kwargs["carried"])

    assert not TaskHistory.objects.filter(id=run_id).exists()
    assert "Postgres does not have this run" in caplog.text
    assert running([TASK]) == {TASK: 0}


@pytest.mark.parametrize("redelivered", [False, True], ids=["first", "redelivered"])
def test_a_paused_run_is_parked_by_its_claim_unclaimed_in_both_stores(redelivered: bool) -> None:
    task = "test-solo"  # no other test runs it: its pause holds nobody else's runs
    run_id = start_run(task, {}, trigger=TriggerKind.MANUAL).run_id
    args, kwargs = take_message(task, run_id)
    paused = keys.pause_field("task", task)
    valkey.client().hset(keys.pauses(), paused, "hold")
    try:
        run_message(task, *args, redelivered=redelivered, carried=kwargs["carried"])
    finally:
        valkey.client().hdel(keys.pauses(), paused)

    assert TaskHistory.objects.get(id=run_id).state == "pending"
    assert (live.read(run_id)["state"], live.read(run_id).get("owner", "")) == ("pending", "")
    # Resumed: the same message claims and runs it.
    run_message(task, *args, carried=kwargs["carried"])
    assert TaskHistory.objects.get(id=run_id).state == "completed"


def test_a_paused_run_its_limit_postpones_is_parked_not_put_back_again() -> None:
    """The concurrency limit answers before the claim's script would see the pause: a run of
    a paused task at its limit is parked all the same, not published again and again."""
    task = "test-rt-limited"  # max_concurrent=2; no shared worker takes its queue
    definition = registry.get()[task]
    limits = (keys.concurrency_holders(task), keys.concurrency_waiters(task))
    valkey.client().delete(*limits, keys.concurrency_postponed(task), keys.rate_window(task))
    run_id = start_run(task, {"key": uuid.uuid4().hex}, trigger=TriggerKind.MANUAL).run_id
    args, kwargs = take_message(task, run_id)
    holders = [Pickup(definition, holder, "host:1:other") for holder in ("run_a", "run_b")]
    for holder in holders:
        dispatch.before_claim(holder)
    paused = keys.pause_field("task", task)
    valkey.client().hset(keys.pauses(), paused, "hold")
    try:
        run_message(task, *args, carried=kwargs.get("carried"))
    finally:
        valkey.client().hdel(keys.pauses(), paused)
        for holder in holders:
            dispatch.release(holder)

    assert TaskHistory.objects.get(id=run_id).state == "pending"
    assert run_id not in in_broker_lists([queue_name(definition, settings.CONFIG.per_task_queues)])


def test_a_batch_start_carries_the_row_as_a_single_start_does() -> None:
    (outcome,) = start_runs([StartRequest(TASK, {})])
    assert outcome.run_id is not None
    args, kwargs = take_message(TASK, outcome.run_id)
    row = TaskHistory.objects.get(id=outcome.run_id)
    assert kwargs["carried"] == {"input": {}, "identity": row.identity, "priority": row.priority}

    with CaptureQueriesContext(connection) as captured:
        run_message(TASK, *args, carried=kwargs["carried"])

    assert len(_statements_on_runs(captured)) == 1
    assert TaskHistory.objects.get(id=outcome.run_id).state == "completed"


def test_an_input_too_long_to_carry_is_read_at_pickup() -> None:
    long_input = {"label": "x" * (CARRY_MAX_CHARS + 1)}
    run_id = start_run("test-fair-a", long_input, trigger=TriggerKind.MANUAL).run_id

    _, kwargs = take_message("test-fair-a", run_id)

    assert kwargs == {}
    run_message("test-fair-a", run_id, 1)  # read from the row instead
    assert TaskHistory.objects.get(id=run_id).state == "completed"


def test_a_short_first_delivery_reads_and_ends_in_one_write() -> None:
    run_id = _start()

    with CaptureQueriesContext(connection) as captured:
        run_message(TASK, run_id, 1)

    statements = _statements_on_runs(captured)
    assert len(statements) == 2, statements
    read, end = statements
    # The claim is folded into the end: read without a write, then one guarded UPDATE (the
    # audit still records both moves).
    assert read.startswith(("SELECT input", "EXECUTE lumastra_read_claimable("))
    assert end.startswith(("UPDATE task_history", "EXECUTE lumastra_end_run("))
    assert not any("ORDER BY" in sql for sql in statements)
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts, row.error, row.result) == ("completed", 1, None, {"ok": True})
    assert row.owner_instance_id != ""
    assert row.started_at is not None and row.started_at <= row.finished_at
    assert list(
        TaskHistoryAudit.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("from_state", "to_state")
    ) == [(None, "pending"), ("pending", "active"), ("active", "completed")]
    assert live.read(run_id)["state"] == "completed"
    assert running([TASK]) == {TASK: 0}


@pytest.mark.worker
def test_a_run_still_going_after_a_second_has_its_claim_written_by_its_watch() -> None:
    empty_queues(SLEEPY_QUEUE)
    with worker_process([SLEEPY_QUEUE], concurrency=1, name="claim-after"):
        run_id = start_run("test-sleepy", {"seconds": 3}, trigger=TriggerKind.MANUAL).run_id
        held = wait_for(lambda: _active_in_valkey(run_id), timeout=30)

        row = wait_for(
            lambda: TaskHistory.objects.filter(id=run_id, state="active").first(), timeout=10
        )
        # Written while the handler still runs, for the claim Valkey holds, as of its moment.
        assert live.read(run_id)["state"] == "active"
        assert (row.owner_instance_id, row.attempts) == (held["owner"], 1)
        assert row.started_at is not None and row.heartbeat_at is not None
        # (Valkey's clock and the worker's: the same moment, give or take a few ms.)
        assert abs(row.started_at.timestamp() * 1000 - int(held["started_at"])) < 100
        # The audit records the claim at the moment it was taken, not when it was written.
        claimed = TaskHistoryAudit.objects.get(run_id=run_id, to_state="active")
        assert claimed.at == row.started_at
        wait_for(lambda: TaskHistory.objects.get(id=run_id).state == "completed", timeout=30)

    assert _moves(run_id) == [(None, "pending"), ("pending", "active"), ("active", "completed")]


def _active_in_valkey(run_id: str) -> live.RunHash | None:
    held = live.read(run_id)
    return held if held.get("state") == "active" else None


def _moves(run_id: str) -> list[tuple[str | None, str]]:
    return list(
        TaskHistoryAudit.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("from_state", "to_state")
    )


def test_a_cancel_writes_a_claim_postgres_has_not_heard_of_and_reaches_its_handler() -> None:
    run_id = _start()
    # A worker's claim as the runner leaves it while the run is young: Valkey only.
    live.claim(run_id, "worker-a", live.NO_PAUSE)
    assert durable.read_claimable(run_id, since=timezone.now()) is not None

    assert request_cancel(run_id, actor="ops") == RunState.CANCELLING

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id, row.attempts) == ("cancelling", "worker-a", 1)
    assert live.read(run_id)["state"] == "cancelling"
    assert _moves(run_id) == [(None, "pending"), ("pending", "active"), ("active", "cancelling")]


def test_a_retry_delivered_before_its_time_is_given_back_in_both_stores() -> None:
    run_id = _start()
    not_before = timezone.now() + timedelta(hours=1)
    TaskHistory.objects.filter(id=run_id).update(not_before=not_before)

    run_message(TASK, run_id, 1)

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts, row.owner_instance_id) == ("pending", 0, "")
    assert live.read(run_id)["state"] == "pending"
    assert running([TASK]) == {TASK: 0}


@pytest.mark.parametrize("carried", [False, True], ids=["row-read", "carried"])
def test_a_cancel_that_reached_postgres_first_ends_the_run_cancelled(carried: bool) -> None:
    run_id = _start()
    _, kwargs = take_message(TASK, run_id)
    # Cancelled in Postgres, its live hash not yet told: the Valkey claim succeeds; the read
    # finds the run not pending, or (nothing read: its message carried the row) the handler
    # runs and its end is refused. Either way the cancel stands.
    TaskHistory.objects.filter(id=run_id).update(state="cancelling")

    run_message(TASK, run_id, 1, carried=kwargs["carried"] if carried else None)

    assert TaskHistory.objects.get(id=run_id).state == "cancelled"
    assert live.read(run_id)["state"] == "cancelled"
    assert running([TASK]) == {TASK: 0}


def test_a_duplicate_of_an_ended_run_is_dropped_and_gives_its_slot_back() -> None:
    run_id = _start()
    run_message(TASK, run_id, 1)

    run_message(TASK, run_id, 1)

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts) == ("completed", 1)
    assert running([TASK]) == {TASK: 0}


def test_a_redelivery_whose_claimer_died_before_postgres_heard_counts_the_lost_attempt() -> None:
    run_id = _start()
    # A pool child of this host claimed the run in Valkey and was killed within its first
    # second, before its claim reached Postgres; Celery gives its message back.
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_owner = f"{socket.gethostname()}:{gone.pid}:DEADBEEF"
    live.claim(run_id, dead_owner, live.NO_PAUSE)

    run_message(TASK, run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    # Resumed as any lost worker's run: the lost attempt counted, the run due again.
    assert (row.state, row.attempts, row.error["kind"]) == ("pending", 1, "worker_lost")
    assert _moves(run_id) == [(None, "pending"), ("pending", "active"), ("active", "pending")]
    assert live.read(run_id)["state"] == "pending"
    assert running([TASK]) == {TASK: 0}


def test_a_delivery_whose_live_hash_is_gone_waits_for_a_claim_valkey_forgot_then_runs() -> None:
    run_id = _start()
    _drop_messages()
    valkey.client().delete(keys.run_active(run_id))

    run_message(TASK, run_id, 1)

    # Not run yet: a handler may hold a claim Postgres has not heard of (a plain run's first
    # second), lost with the hash; until the mark runs out, only that handler claims the run.
    assert TaskHistory.objects.get(id=run_id).state == "pending"
    assert live.read(run_id)["state"] == "pending"
    assert 0 < valkey.client().pttl(keys.run_reseeded(run_id)) <= live.reseed_settle_s() * 1000
    (message,) = _messages()  # its message again, for later
    assert datetime.fromisoformat(message["headers"]["eta"]) > timezone.now()

    run_message(TASK, run_id, 1)  # back while the mark stands: not run, published again
    assert TaskHistory.objects.get(id=run_id).state == "pending"
    assert len(_messages()) == 2

    valkey.client().delete(keys.run_reseeded(run_id))  # the mark ran out
    run_message(TASK, run_id, 1)

    assert TaskHistory.objects.get(id=run_id).state == "completed"
    assert live.read(run_id)["state"] == "completed"
    assert running([TASK]) == {TASK: 0}


def _queue_lists() -> list[str]:
    queue = queue_name(registry.get()[TASK], settings.CONFIG.per_task_queues)
    return [keys.broker_queue(queue, step) for step in keys.BROKER_PRIORITY_STEPS]


def _drop_messages() -> None:
    broker.client().delete(*_queue_lists())


def _messages() -> list[dict[str, Any]]:
    client = broker.client()
    return [json.loads(raw) for name in _queue_lists() for raw in client.lrange(name, 0, -1)]


def _claim(run_id: str, owner: str) -> None:
    live.claim(run_id, owner, live.NO_PAUSE)
    assert durable.claim(run_id, owner) is not None


def _lose_claim(run_id: str) -> None:
    """What a crash of Postgres leaves when it loses a claim's commit before its WAL flush
    (the claim does not wait for it): the row as it was before, while Valkey keeps the claim."""
    TaskHistory.objects.filter(id=run_id).update(
        state="pending", owner_instance_id="", started_at=None, heartbeat_at=None, attempts=0
    )


def test_a_claim_postgres_lost_is_taken_by_its_owners_terminal_write_in_one_statement() -> None:
    run_id = _start()
    _claim(run_id, "host-a:1")
    _lose_claim(run_id)

    with CaptureQueriesContext(connection) as captured:
        ended = terminal.end(
            registry.get()[TASK],
            run_id,
            "host-a:1",
            RunState.COMPLETED,
            result={"ok": True},
            attempt=1,  # what the lost claim returned
        )

    (end,) = _statements_on_runs(captured)
    assert end.startswith(("UPDATE task_history", "EXECUTE lumastra_end_run("))

    assert ended == RunState.COMPLETED
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id, row.attempts) == ("completed", "host-a:1", 1)
    assert row.started_at is not None
    assert live.read(run_id)["state"] == "completed"


def test_a_process_valkey_does_not_name_as_owner_cannot_take_a_pending_run_at_its_end() -> None:
    run_id = _start()
    _claim(run_id, "host-a:1")
    _lose_claim(run_id)

    # Refused, nothing written: the run is not this process's (issue 14: a claim put back after
    # its worker was judged lost is refused the same way).
    ended = terminal.end(registry.get()[TASK], run_id, "host-b:2", RunState.COMPLETED)

    assert ended == RunState.PENDING
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id) == ("pending", "")
    assert live.read(run_id)["owner"] == "host-a:1"


def test_a_connection_its_server_ended_between_runs_is_replaced_before_the_next_run() -> None:
    run_message(TASK, _start(), 1)
    run_id = _start()
    raw = connection.connection
    assert raw is not None
    ended_pid = raw.get_backend_pid()
    with closing(psycopg2.connect(**connection.get_connection_params())) as other:
        other.autocommit = True
        other.cursor().execute("SELECT pg_terminate_backend(%s)", [ended_pid])
    # The server's FATAL reaches the idle socket: what the check before a run looks for.
    assert select.select([raw.fileno()], [], [], 5)[0]

    run_message(TASK, run_id, 1)

    assert TaskHistory.objects.get(id=run_id).state == "completed"
    assert connection.connection.get_backend_pid() != ended_pid
