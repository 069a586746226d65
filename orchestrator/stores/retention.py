"""Retention: deleting old history in small batches, each its own short transaction.

`history-retention` (tasks/definitions/maintenance.py, daily) calls `prune_history` for the
engine's tables and the catalog's own pruner (`coverage.retention`) for its outbox; both go through
`prune_in_batches`:

- ended runs (`task_history`) finished more than `LUMASTRA_HISTORY_RETENTION_S` ago, or, for a
  task that declares `retention=Retention(...)` (`tasks.retention`), its completed runs past
  `completed_s` and its failed and cancelled runs past `failed_s` (None: the global setting),
  except its `keep_last` newest ended runs; a run's state changes (`task_history_audit`) go
  with it. Then the state changes recorded more than `LUMASTRA_HISTORY_RETENTION_S` ago whose
  run is gone, and the batches of runs (`run_batches`) released that long ago whose runs are
  all gone;
- webhook deliveries (`webhook_delivery`) delivered or dead and created more than
  `LUMASTRA_WEBHOOK_RETENTION_S` ago (pending ones are never deleted);
- operators' notifications (`notification_outbox`) sent, dead or unsent and created more than
  `LUMASTRA_HISTORY_RETENTION_S` ago (pending ones are never deleted).

Each batch is one statement (`sql/prune_*.sql`): select up to `LUMASTRA_RETENTION_BATCH` rows
`FOR UPDATE SKIP LOCKED`, delete them, report how many and where it stopped; the next batch
starts from there. Run in autocommit, each batch commits on its own, so no lock is held
longer than one batch takes, and a run, delivery or dispatcher touching a row at that moment
is never waited on (its row is skipped).

The runs of every task are pruned by one statement per batch (`sql/prune_runs.sql`): the
tasks' cutoffs and kept boundaries go in as arrays, and one walk of the `finished_at` index
covers them all instead of a walk per task (each row walked is matched against the array, a
nested loop: fine for tens of declaring tasks, measured with 14 in bench/retention.py).
Where a task's kept runs begin (`keep_last`) is read once per pass, before the first batch, one
short read per task that declares it (`sql/prune_runs_kept.sql` says why not one for all).

Not guaranteed: a skipped row (locked at that moment) waits for the next pass; a pass stops at
the first short batch, so rows that became old while it ran also wait for the next one. A run
deleted before its children (its task's retention is shorter) leaves them naming a parent that
is gone (`parent_run_id` is not a foreign key; the engine looks a parent up only while it is
live).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from orchestrator import sql
from orchestrator.states import TERMINAL_RUN_STATES
from tasks.retention import Retention

PRUNE_RUNS = sql.load(__file__, "prune_runs")
PRUNE_RUNS_KEPT = sql.load(__file__, "prune_runs_kept")
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


def prune_history(
    *, batch: int | None = None, retention: Mapping[str, Retention] | None = None
) -> HistoryPruned:
    """Delete the engine's history past its retention settings (see the module); `retention`
    holds the tasks' own, by task id."""
    history_cutoff = seconds_ago(settings.CONFIG.history_retention_s)
    runs = prune_in_batches(
        PRUNE_RUNS, runs_params(history_cutoff, retention or {}), start=FIRST_MOMENT, batch=batch
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


TERMINAL = sorted(state.value for state in TERMINAL_RUN_STATES)


def runs_params(cutoff: datetime, retention: Mapping[str, Retention]) -> dict[str, Any]:
    """prune_runs.sql's parameters but `after` and `batch`: the global cutoff and, by position,
    each task's own cutoffs and where its kept runs begin."""
    tasks = sorted(retention)
    now = timezone.now()

    def before(seconds: int | None) -> datetime:
        return cutoff if seconds is None else now - timedelta(seconds=seconds)

    completed = [before(retention[task].completed_s) for task in tasks]
    failed = [before(retention[task].failed_s) for task in tasks]
    kept = kept_from({task: retention[task].keep_last or 0 for task in tasks})
    return {
        "cutoff": cutoff,
        "until": max([cutoff, *completed, *failed]),
        "terminal": TERMINAL,
        "tasks": tasks,
        "completed_before": completed,
        "failed_before": failed,
        "kept_at": [kept[task][0] if task in kept else None for task in tasks],
        "kept_id": [kept[task][1] if task in kept else None for task in tasks],
    }


def kept_from(keep_last: Mapping[str, int]) -> dict[str, tuple[datetime, str]]:
    """Where each task's `keep_last` newest ended runs begin, (created_at, id), for the tasks
    that keep some; FIRST_MOMENT (every run kept) for one with fewer ended runs than that."""
    found: dict[str, tuple[datetime, str]] = {}
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        for task, count in sorted(keep_last.items()):
            if count > 0:
                cursor.execute(
                    PRUNE_RUNS_KEPT, {"task": task, "keep_last": count, "terminal": TERMINAL}
                )
                row = cursor.fetchone()
                found[task] = (FIRST_MOMENT, "") if row is None else (row[0], row[1])
    return found
