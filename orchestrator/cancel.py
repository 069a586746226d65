"""Cancelling runs. Today: runs still waiting in the broker, whose message is already gone
(shed by backpressure). Operator cancellation of running work comes with issue 4."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.utils import timezone

from orchestrator import durable, lifecycle, live
from orchestrator.hooks import Outcome
from orchestrator.models import TaskHistory
from orchestrator.states import IllegalTransition, RunState
from tasks import registry
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)


def cancel_waiting(run_ids: Iterable[str], kind: ErrorKind, message: str) -> int:
    """pending → cancelling → cancelled in both stores, Postgres first; returns how many.

    A run that is no longer pending (a worker took it meanwhile) is left alone."""
    cancelled = 0
    for run_id in run_ids:
        try:
            durable.transition(run_id, RunState.CANCELLING)
        except IllegalTransition as exc:
            log.info("run %s: not cancelled (%s): %s", run_id, kind.value, exc)
            continue
        durable.transition(
            run_id,
            RunState.CANCELLED,
            error={"kind": kind.value, "message": message},
            finished_at=timezone.now(),
        )
        for target in (RunState.CANCELLING, RunState.CANCELLED):
            try:
                live.transition(run_id, target)
            except IllegalTransition as exc:
                log.warning("run %s: cancelled in Postgres, live hash disagreed: %s", run_id, exc)
                break
        task_id = TaskHistory.objects.values_list("task_id", flat=True).get(id=run_id)
        lifecycle.finished(Outcome(registry.get()[task_id], run_id, "", RunState.CANCELLED, kind))
        cancelled += 1
    return cancelled
