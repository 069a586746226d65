"""Retention of the catalog outbox's dead letters, called by `history-retention`.

An event the dispatcher failed LUMASTRA_COVERAGE_DISPATCH_MAX_ATTEMPTS times is dead-lettered
(`event_outbox.dead_at`) and kept for an operator (Coverage → dead letters in the admin). Once
it has been dead longer than `LUMASTRA_COVERAGE_OUTBOX_RETENTION_S` it is deleted, in the
engine's short batches (`orchestrator.stores.retention`). Events still due are never touched.
"""

from __future__ import annotations

from django.conf import settings

from orchestrator import sql
from orchestrator.stores.retention import FIRST_ID, prune_in_batches, seconds_ago

PRUNE_DEAD_EVENTS = sql.load(__file__, "prune_dead_events")


def prune_dead_events(*, batch: int | None = None) -> int:
    """Delete dead-lettered outbox events past their retention; how many went."""
    cutoff = seconds_ago(settings.COVERAGE.outbox_retention_s)
    return prune_in_batches(
        PRUNE_DEAD_EVENTS, {"cutoff": cutoff}, start=FIRST_ID, batch=batch
    ).deleted
