"""The runner's claim of a first delivery (issue 9): one guarded UPDATE, no read before it,
and every refusal taken back in both stores before the row decides what the message was.

The runner is called in this process, as a worker's pool child would call it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestrator.hooks.concurrency import running
from orchestrator.models import TaskHistory
from orchestrator.runs.runner import run_message
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, live, valkey
from orchestrator.triggers import TriggerKind

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-noop"


def _start() -> str:
    return start_run(TASK, {}, trigger=TriggerKind.MANUAL).run_id


def _statements_on_runs(captured: CaptureQueriesContext) -> list[str]:
    """The statements on task_history, without their leading comment lines."""
    statements = [q["sql"] for q in captured.captured_queries if "task_history" in q["sql"]]
    return [
        "\n".join(line for line in sql.splitlines() if not line.startswith("--")).strip()
        for sql in statements
    ]


def test_a_first_delivery_claims_and_ends_in_two_statements_without_a_read() -> None:
    run_id = _start()

    with CaptureQueriesContext(connection) as captured:
        run_message(TASK, run_id, 1)

    statements = _statements_on_runs(captured)
    assert len(statements) == 2, statements
    claim, end = statements
    assert claim.startswith("UPDATE task_history") and "RETURNING" in claim
    assert end.startswith("UPDATE task_history")
    assert not any("ORDER BY" in sql for sql in statements)
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts, row.error, row.result) == ("completed", 1, None, {"ok": True})
    assert row.started_at is not None and row.heartbeat_at is not None
    assert live.read(run_id)["state"] == "completed"
    assert running([TASK]) == {TASK: 0}


def test_a_retry_delivered_before_its_time_is_given_back_in_both_stores() -> None:
    run_id = _start()
    not_before = timezone.now() + timedelta(hours=1)
    TaskHistory.objects.filter(id=run_id).update(not_before=not_before)

    run_message(TASK, run_id, 1)

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts, row.owner_instance_id) == ("pending", 0, "")
    assert live.read(run_id)["state"] == "pending"
    assert running([TASK]) == {TASK: 0}


def test_a_cancel_that_reached_postgres_first_ends_the_run_cancelled() -> None:
    run_id = _start()
    # Cancelled in Postgres, its live hash not yet told: the Valkey claim succeeds and the
    # UPDATE refuses.
    TaskHistory.objects.filter(id=run_id).update(state="cancelling")

    run_message(TASK, run_id, 1)

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


def test_a_first_delivery_whose_live_hash_is_gone_seeds_it_again_and_runs() -> None:
    run_id = _start()
    valkey.client().delete(keys.run_active(run_id))

    run_message(TASK, run_id, 1)

    assert TaskHistory.objects.get(id=run_id).state == "completed"
    assert live.read(run_id)["state"] == "completed"
