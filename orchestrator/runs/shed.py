"""Runs cancelled before a worker took them: backpressure's shed (`cancel_waiting`); and the cancel
signal every cancel sends (`signal`). Kept apart from `runs.cancel`, which moves pipelines, so
the start path (`runs.start`) can shed without depending on them."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from redis.exceptions import ResponseError

from orchestrator.models import TaskHistory
from orchestrator.runs import retries, terminal
from orchestrator.states import IllegalTransition, RunState
from orchestrator.stores import durable, keys, valkey
from tasks import registry
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)


def signal(run_id: str, actor: str) -> None:
    """Valkey follows Postgres: the hash goes cancelling and the process that owns the run is
    told, on its own cancel channel (nobody, if no process has claimed it)."""
    try:
        valkey.script(
            "request_cancel",
            [keys.run_active(run_id), keys.run_terminal(run_id), keys.cancel_channel_prefix()],
            [actor, settings.CONFIG.run_active_ttl_s],
        )
    except ResponseError as exc:
        # A lost hash cannot stop the cancel Postgres has recorded; the heartbeat re-reads it.
        log.warning("run %s: cancel recorded in Postgres, live hash refused: %s", run_id, exc)


def cancel_waiting(run_ids: Iterable[str], kind: ErrorKind, message: str) -> int:
    """Cancel runs whose messages were taken out of the broker (shed); returns how many.

    A run that is no longer pending (a worker took it meanwhile) is left alone."""
    cancelled = 0
    for run_id in run_ids:
        task_id = TaskHistory.objects.filter(id=run_id).values_list("task_id", flat=True).first()
        if task_id is None:
            continue
        try:
            durable.request_cancel(run_id, sources=(RunState.PENDING,))
        except IllegalTransition as exc:
            log.info("run %s: not cancelled (%s): %s", run_id, kind.value, exc)
            continue
        signal(run_id, kind.value)
        terminal.cancel(registry.get()[task_id], run_id, error=retries.error_doc(kind, message))
        cancelled += 1
    return cancelled
