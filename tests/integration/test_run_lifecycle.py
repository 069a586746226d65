"""A run end to end on a real worker: Postgres and Valkey agree at every step."""

from __future__ import annotations

import pytest
from celery import current_app
from django.db import transaction

from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.stores import live
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _terminal(run_id: str) -> TaskHistory | None:
    row = TaskHistory.objects.get(id=run_id)
    return row if row.state in ("completed", "failed", "cancelled") else None


def test_run_completes_and_both_stores_agree(celery_worker: object) -> None:
    handle = start_run("test-noop", {}, trigger=TriggerKind.MANUAL)

    row = wait_for(lambda: _terminal(handle.run_id))

    assert row.state == "completed"
    assert row.result == {"ok": True}
    assert row.started_at is not None and row.finished_at is not None
    assert row.owner_instance_id
    assert row.attempts == 1
    # Valkey follows Postgres (`runs.terminal.settle`): a read right after the row's end may be
    # early.
    snapshot = wait_for(
        lambda: (found := live.read(handle.run_id))["state"] == "completed" and found
    )
    assert snapshot["state"] == "completed"
    assert snapshot["owner"] == row.owner_instance_id


@pytest.mark.parametrize(
    ("how", "kind"),
    [
        ("permanent", "permanent"),
        ("fatal", "fatal"),
        ("transient", "transient"),
        ("crash", "internal"),
    ],
)
def test_failing_handler_records_its_error_kind(celery_worker: object, how: str, kind: str) -> None:
    handle = start_run("test-fail", {"how": how}, trigger=TriggerKind.MANUAL)

    row = wait_for(lambda: _terminal(handle.run_id))

    assert row.state == "failed"
    assert row.error["kind"] == kind
    wait_for(lambda: live.read(handle.run_id)["state"] == "failed")  # Valkey follows Postgres
    # A crash keeps where it happened; an error the handler raised on purpose needs no trace.
    if how == "crash":
        assert "ZeroDivisionError: the handler divided by zero" in row.error["traceback"]
        assert "in _fail" in row.error["traceback"]
    else:
        assert "traceback" not in row.error


def test_run_exists_only_if_the_callers_transaction_commits(celery_worker: object) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = start_run("test-noop", {}, trigger=TriggerKind.MANUAL)
        raise RuntimeError("caller aborts")
    with transaction.atomic():
        committed = start_run("test-noop", {}, trigger=TriggerKind.MANUAL)
        assert live.read(committed.run_id) == {}  # nothing published before commit

    wait_for(lambda: _terminal(committed.run_id))
    assert not TaskHistory.objects.filter(id=rolled_back.run_id).exists()
    assert live.read(rolled_back.run_id) == {}


def test_stale_processing_version_is_refused(celery_worker: object) -> None:
    handle = start_run("test-versioned", {}, trigger=TriggerKind.MANUAL)
    wait_for(lambda: _terminal(handle.run_id))
    stale = TaskHistory.objects.create(
        id="run_stale0000000000000000000000",
        task_id="test-versioned",
        priority=5,
        identity="x",
        processing_version=1,
        trigger={"kind": "manual"},
    )
    live.seed(stale.id, stale.task_id, 5, ())

    current_app.send_task(
        "test-versioned", args=[stale.id, 1], queue="task.t.test-versioned", priority=5
    )

    row = wait_for(lambda: _terminal(stale.id))
    assert TaskHistory.objects.get(id=handle.run_id).state == "completed"
    assert row.state == "failed"
    assert row.error["kind"] == "stale_version"
    assert row.started_at is None
    assert live.read(stale.id)["state"] == "failed"


def test_idempotency_key_returns_the_live_run(celery_worker: object) -> None:
    with transaction.atomic():
        first = start_run("test-noop", {}, trigger=TriggerKind.API, idempotency_key="k-1")
        again = start_run("test-noop", {}, trigger=TriggerKind.API, idempotency_key="k-1")

    assert again.deduplicated and again.run_id == first.run_id
    wait_for(lambda: _terminal(first.run_id))
    fresh = start_run("test-noop", {}, trigger=TriggerKind.API, idempotency_key="k-1")
    assert not fresh.deduplicated and fresh.run_id != first.run_id
