"""Retention: deleting old history in small batches, each its own short transaction.

`history-retention` (tasks/definitions/maintenance.py, daily) calls `prune_history` for the
engine's tables and the catalog's own pruner (`coverage.retention`) for its outbox; both go through
`prune_in_batches`:

- ended runs (`task_history`) finished, and state changes (`task_history_audit`) recorded,
  more than `LUMASTRA_HISTORY_RETENTION_S` ago, then the batches of runs (`run_batches`)
  released that long ago whose runs are all gone;
- webhook deliveries (`webhook_delivery`) delivered or dead and created more than
  `LUMASTRA_WEBHOOK_RETENTION_S` ago (pending ones are never deleted);
- operators' notifications (`notification_outbox`) sent, dead or unsent and created more than
  `LUMASTRA_HISTORY_RETENTION_S` ago (pending ones are never deleted).

Each batch is one statement (`sql/prune_*.sql`): select up to `LUMASTRA_RETENTION_BATCH` rows
`FOR UPDATE SKIP LOCKED`, delete them, report how many and where it stopped; the next batch
starts from there. Run in autocommit, each batch commits on its own, so no lock is held
longer than one batch takes, and a run, delivery or dispatcher touching a row at that moment
is never waited on (its row is skipped).

Not guaranteed: a skipped row (locked at that moment) waits for the next pass; a pass stops at
the first short batch, so rows that became old while it ran also wait for the next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from orchestrator import sql
from orchestrator.states import TERMINAL_RUN_STATES

PRUNE_RUNS = sql.load(__file__, "prune_runs")
PRUNE_AUDIT = sql.load(__file__, "prune_audit")
PRUNE_BATCHES = sql.load(__file__, "prune_batches")
PRUNE_WEBHOOK_DELIVERIES = sql.load(__file__, "prune_webhook_deliveries")
PRUNE_NOTIFICATIONS = sql.load(__file__, "prune_notifications")

# Where the first batch of a table starts: before any id (an id cursor) or any moment.
FIRST_ID = 0
FIRST_MOMENT = datetime(1, 1, 1, tzinfo=UTC)


class InTransaction(RuntimeError):
    """A pruner was called inside a transaction, which would hold every batch's locks."""


@dataclass(frozen=True)
class Pruned:
    deleted: int
    batches: int


def prune_in_batches(
    sql: str, params: dict[str, Any], *, start: int | datetime, batch: int | None = None
) -> Pruned:
    """Run a prune statement (parameters `after` and `batch` added to `params`; it returns
    one row `(deleted, last cursor)`) until a batch deletes fewer rows than `batch`."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.in_atomic_block:
        raise InTransaction("retention deletes in batches that commit on their own")
    size = batch or settings.CONFIG.retention_batch
    after, deleted, batches = start, 0, 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, {**params, "after": after, "batch": size})
            count, last = cursor.fetchone()
        deleted += count
        batches += 1
        if count < size:
            return Pruned(deleted, batches)
        after = last


def seconds_ago(seconds: float) -> datetime:
    return timezone.now() - timedelta(seconds=seconds)


@dataclass(frozen=True)
class HistoryPruned:
    runs: int
    audit: int
    webhook_deliveries: int
    batches: int
    notifications: int


def prune_history(*, batch: int | None = None) -> HistoryPruned:
    """Delete the engine's history past its retention settings (see the module)."""
    history_cutoff = seconds_ago(settings.CONFIG.history_retention_s)
    terminal = [state.value for state in TERMINAL_RUN_STATES]
    runs = prune_in_batches(
        PRUNE_RUNS,
        {"cutoff": history_cutoff, "terminal": terminal},
        start=FIRST_MOMENT,
        batch=batch,
    )
    audit = prune_in_batches(PRUNE_AUDIT, {"cutoff": history_cutoff}, start=FIRST_ID, batch=batch)
    batches = prune_in_batches(
        PRUNE_BATCHES, {"cutoff": history_cutoff}, start=FIRST_MOMENT, batch=batch
    )
    deliveries = prune_in_batches(
        PRUNE_WEBHOOK_DELIVERIES,
        {"cutoff": seconds_ago(settings.CONFIG.webhook_retention_s)},
        start=FIRST_ID,
        batch=batch,
    )
    notifications = prune_in_batches(
        PRUNE_NOTIFICATIONS, {"cutoff": history_cutoff}, start=FIRST_ID, batch=batch
    )
    return HistoryPruned(
        runs.deleted, audit.deleted, deliveries.deleted, batches.deleted, notifications.deleted
    )
