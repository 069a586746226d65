"""history-retention: each kind of history past its own retention goes, in short batches that
skip rows another transaction holds; live work and recent history stay."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import psycopg2
import psycopg2.extensions
import pytest
from django.conf import LazySettings, settings
from django.db import connection, transaction
from django.utils import timezone

from coverage.models import EventOutbox
from orchestrator.models import (
    DeliveryStatus,
    Notification,
    NotificationStatus,
    RunBatch,
    TaskHistory,
    TaskHistoryAudit,
    WebhookDelivery,
    WebhookEndpoint,
)
from orchestrator.runs.context import RunContext
from orchestrator.states import RunState
from orchestrator.stores.retention import (
    FIRST_ID,
    PRUNE_AUDIT,
    InTransaction,
    prune_history,
    prune_in_batches,
)
from tasks.definition import NoInput
from tasks.definitions.maintenance import history_retention
from tests.support.fixtures import database_url

DAY_S = 86400

pytestmark = pytest.mark.django_db(transaction=True)


def _days_ago(days: int) -> timezone.datetime:
    return timezone.now() - timedelta(days=days)


def _run(run_id: str, state: RunState, finished_days_ago: int | None) -> None:
    finished = None if finished_days_ago is None else _days_ago(finished_days_ago)
    TaskHistory.objects.create(
        id=run_id, task_id="test-noop", priority=5, identity=run_id, state=state,
        finished_at=finished,
    )  # fmt: skip


def _delivery(endpoint: WebhookEndpoint, event: str, status: str, days_ago: int) -> None:
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event_id=event, event_type="run.completed", run_id="run_x",
        envelope={}, status=status,
    )  # fmt: skip
    WebhookDelivery.objects.filter(pk=delivery.pk).update(created_at=_days_ago(days_ago))


def _event(kind: str, dead_days_ago: int | None, created_days_ago: int = 0) -> None:
    dead_at = None if dead_days_ago is None else _days_ago(dead_days_ago)
    EventOutbox.objects.create(
        kind=kind, item_id=1, dead_at=dead_at, created_at=_days_ago(created_days_ago)
    )


def test_each_kind_of_history_goes_past_its_own_retention() -> None:
    keep = settings.CONFIG.history_retention_s // DAY_S
    keep_webhooks = settings.CONFIG.webhook_retention_s // DAY_S
    keep_dead = settings.COVERAGE.outbox_retention_s // DAY_S
    _run("run_01OLD000000000000000000000", RunState.COMPLETED, keep + 1)
    _run("run_01NEW000000000000000000000", RunState.COMPLETED, 1)
    _run("run_01LIVE00000000000000000000", RunState.ACTIVE, None)
    TaskHistoryAudit.objects.filter(
        run_id__in=["run_01OLD000000000000000000000", "run_01LIVE00000000000000000000"]
    ).update(at=_days_ago(keep + 1))
    # A state change whose run is already gone: the audit's own pass deletes it.
    TaskHistoryAudit.objects.create(
        run_id="run_01GONE00000000000000000000", to_state="pending", at=_days_ago(keep + 1)
    )
    endpoint = WebhookEndpoint.objects.create(
        url="https://example.org/h", secret="s", enabled=False
    )
    _delivery(endpoint, "delivered-old", DeliveryStatus.DELIVERED, keep_webhooks + 1)
    _delivery(endpoint, "dead-old", DeliveryStatus.DEAD, keep_webhooks + 1)
    _delivery(endpoint, "pending-old", DeliveryStatus.PENDING, keep_webhooks + 1)  # still owed
    _delivery(endpoint, "delivered-new", DeliveryStatus.DELIVERED, 1)
    _event("dead-old", dead_days_ago=keep_dead + 1, created_days_ago=keep_dead + 2)
    _event("dead-new", dead_days_ago=1, created_days_ago=keep_dead + 2)
    _event("due-old", dead_days_ago=None, created_days_ago=keep_dead + 2)  # still owed
    for title, status, age in (
        ("sent-old", NotificationStatus.SENT, keep + 1),
        ("unsent-old", NotificationStatus.UNSENT, keep + 1),
        ("pending-old", NotificationStatus.PENDING, keep + 1),  # still owed
        ("sent-new", NotificationStatus.SENT, 1),
    ):
        made = Notification.objects.create(kind="test", title=title, status=status)
        Notification.objects.filter(pk=made.pk).update(created_at=_days_ago(age))

    result = history_retention(RunContext("run_01RETENTION000000000000000", NoInput()), NoInput())

    assert result == {
        "deleted": 1,
        "audit_deleted": 1,
        "webhook_deliveries_deleted": 2,
        "dead_events_deleted": 1,
        "batches_deleted": 0,
        "notifications_deleted": 2,
    }
    assert set(TaskHistory.objects.values_list("id", flat=True)) == {
        "run_01NEW000000000000000000000",
        "run_01LIVE00000000000000000000",
    }
    # The old run's changes went with it; a live run keeps its changes, however old.
    assert set(TaskHistoryAudit.objects.values_list("run_id", flat=True)) == {
        "run_01NEW000000000000000000000",
        "run_01LIVE00000000000000000000",
    }
    assert set(WebhookDelivery.objects.values_list("event_id", flat=True)) == {
        "pending-old",
        "delivered-new",
    }
    assert set(EventOutbox.objects.values_list("kind", flat=True)) == {"dead-new", "due-old"}
    assert set(Notification.objects.values_list("title", flat=True)) == {"pending-old", "sent-new"}


def test_a_batch_goes_once_released_past_retention_and_its_runs_are_gone() -> None:
    def batch(batch_id: str, released_days_ago: int | None) -> None:
        released = None if released_days_ago is None else _days_ago(released_days_ago)
        RunBatch.objects.create(id=batch_id, total=1, open=0, released_at=released)

    batch("batch_old_gone", 400)  # released long ago, its run deleted below: goes
    batch("batch_old_kept_run", 400)  # its run is still kept: stays
    batch("batch_new", 1)
    batch("batch_unreleased", None)
    _run("run_01OLDBATCH000000000000000", RunState.COMPLETED, 400)
    _run("run_01KEPT000000000000000000", RunState.PENDING, None)
    TaskHistory.objects.filter(id="run_01OLDBATCH000000000000000").update(batch_id="batch_old_gone")
    TaskHistory.objects.filter(id="run_01KEPT000000000000000000").update(
        batch_id="batch_old_kept_run"
    )

    pruned = prune_history()

    assert pruned.batches == 1
    assert set(RunBatch.objects.values_list("id", flat=True)) == {
        "batch_old_kept_run",
        "batch_new",
        "batch_unreleased",
    }


def test_retention_settings_are_each_its_own(settings: LazySettings) -> None:
    settings.CONFIG = dataclasses.replace(
        settings.CONFIG, history_retention_s=100 * DAY_S, webhook_retention_s=2 * DAY_S
    )
    _run("run_01MID000000000000000000000", RunState.FAILED, 10)
    endpoint = WebhookEndpoint.objects.create(
        url="https://example.org/h", secret="s", enabled=False
    )
    _delivery(endpoint, "delivered-10d", DeliveryStatus.DELIVERED, 10)

    pruned = prune_history()

    assert (pruned.runs, pruned.webhook_deliveries) == (0, 1)


def test_a_pass_deletes_in_batches_until_a_short_one() -> None:
    for index in range(10):
        _run(f"run_01B{index:022d}", RunState.COMPLETED, None)
    TaskHistoryAudit.objects.update(at=_days_ago(400))
    TaskHistory.objects.all().delete()  # only the changes of runs that are gone go

    pruned = prune_in_batches(PRUNE_AUDIT, {"cutoff": _days_ago(300)}, start=FIRST_ID, batch=3)

    assert (pruned.deleted, pruned.batches) == (10, 4)  # 3 + 3 + 3 + 1
    assert not TaskHistoryAudit.objects.exists()


@pytest.fixture
def other_transaction() -> Iterator[psycopg2.extensions.cursor]:
    other = psycopg2.connect(database_url())
    try:
        yield other.cursor()
    finally:
        other.rollback()
        other.close()


def test_a_row_another_transaction_holds_is_skipped_not_waited_for(
    other_transaction: psycopg2.extensions.cursor,
) -> None:
    old = settings.CONFIG.history_retention_s // DAY_S + 1
    for index in range(5):
        _run(f"run_01L{index:022d}", RunState.COMPLETED, old)
    held = "run_01L0000000000000000000002"
    other_transaction.execute("SELECT 1 FROM task_history WHERE id = %s FOR UPDATE", [held])
    # Waiting on the held row would fail the test here instead of hanging it.
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")
    try:
        pruned = prune_history(batch=2)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    assert pruned.runs == 4
    assert list(TaskHistory.objects.values_list("id", flat=True)) == [held]


def test_pruning_inside_a_transaction_is_refused() -> None:
    # One transaction around every batch would hold all their locks until the end.
    with transaction.atomic(), pytest.raises(InTransaction):
        prune_history()
