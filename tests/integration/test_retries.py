"""Transient failures retry with backoff on the same run, then fail as attempts exhausted."""

from __future__ import annotations

import pytest
from django.test import Client

from orchestrator.models import TaskHistory, TaskHistoryAudit
from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.task_defs import FLAKY_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _ended(run_id: str) -> TaskHistory | None:
    row = TaskHistory.objects.get(id=run_id)
    return row if row.state in ("completed", "failed") else None


def test_transient_failures_retry_until_success_and_until_exhausted() -> None:
    valkey.client().delete(FLAKY_KEY)
    with worker_process(["task.t.test-flaky"], concurrency=1, name="flaky"):
        recovers = start_run(
            "test-flaky", {"label": "recovers", "fail_times": 2}, trigger=TriggerKind.MANUAL
        )
        gives_up = start_run(
            "test-flaky", {"label": "gives-up", "fail_times": 9}, trigger=TriggerKind.MANUAL
        )
        done = wait_for(lambda: _ended(recovers.run_id), timeout=30)
        failed = wait_for(lambda: _ended(gives_up.run_id), timeout=30)

    assert done.state == "completed" and done.attempts == 3
    assert done.result == {"calls": 3}
    # A failed attempt's claim is written before it is put back (`execute._retry_later`); the
    # last attempt, a short one, ends with its claim folded into its end (both moves audited).
    assert _moves(done.id) == [
        (None, "pending"),
        *[("pending", "active"), ("active", "pending")] * 2,
        ("pending", "active"),
        ("active", "completed"),
    ]
    assert failed.state == "failed" and failed.attempts == 3
    assert failed.error["kind"] == "transient"
    assert "attempts exhausted: 3 of 3" in failed.error["message"]
    assert failed.error["exhausted"] is True
    assert valkey.client().hget(FLAKY_KEY, "gives-up") == "3"


def _moves(run_id: str) -> list[tuple[str | None, str]]:
    return list(
        TaskHistoryAudit.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("from_state", "to_state")
    )


def test_dead_letters_are_listed_in_the_admin(admin_client: Client) -> None:
    exhausted = TaskHistory.objects.create(
        id="run_dead",
        task_id="test-flaky",
        priority=5,
        identity="x",
        state="failed",
        error={"kind": "transient", "message": "attempts exhausted", "exhausted": True},
    )
    TaskHistory.objects.create(
        id="run_other",
        task_id="test-flaky",
        priority=5,
        identity="y",
        state="failed",
        error={"kind": "permanent", "message": "no"},
    )

    page = admin_client.get(
        "/admin/orchestrator/taskhistory/", {"outcome": "dead-letter"}
    ).content.decode()

    assert exhausted.id in page and "run_other" not in page
