"""The runner: the body of every Celery task.

On pickup: processing_version guard → claim in Valkey (owner, pending → active) → Postgres
pending → active → build the context → `execute(ctx, input)` → terminal write, Postgres
first, then Valkey fenced by the claim's owner. Database connections are checked before and
after each run, so a connection dropped between runs is replaced rather than failing a run.

Not here yet (later issues): heartbeats and watchdogs, retries of transient errors,
redelivery of an active run, the pending-write drain for a failed Postgres write.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from celery.exceptions import Reject
from django.db import close_old_connections
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from orchestrator import durable, lifecycle, live
from orchestrator.context import RunContext
from orchestrator.hooks import Outcome, Pickup, Postpone
from orchestrator.instance import instance_id
from orchestrator.models import TaskHistory
from orchestrator.publish import job_id, publish
from orchestrator.states import TERMINAL_RUN_STATES, IllegalTransition, RunState
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind, TaskError

log = logging.getLogger(__name__)

# A message from a newer deploy goes back to the queue for a newer worker; the pause keeps
# an all-old pool from spinning on it during a rolling deploy.
REQUEUE_PAUSE_S = 1.0


def run_message(task_id: str, run_id: str, processing_version: int) -> None:
    close_old_connections()
    try:
        _run(registry.get()[task_id], run_id, processing_version)
    finally:
        close_old_connections()


def _run(definition: TaskDefinition, run_id: str, processing_version: int) -> None:
    if processing_version > definition.processing_version:
        time.sleep(REQUEUE_PAUSE_S)
        raise Reject(
            f"run {run_id} needs processing_version {processing_version}, "
            f"this worker has {definition.processing_version}",
            requeue=True,
        )
    row = TaskHistory.objects.filter(id=run_id).first()
    if row is None:
        log.error("run %s: message for a run Postgres does not have; dropped", run_id)
        return
    if row.state != RunState.PENDING:
        _not_pending(definition, row)
        return
    if processing_version < definition.processing_version:
        _fail_unstarted(
            definition,
            row,
            ErrorKind.STALE_VERSION,
            f"enqueued for processing_version {processing_version}, "
            f"current is {definition.processing_version}",
        )
        return

    pickup = Pickup(definition, row.id, instance_id())
    try:
        lifecycle.before_claim(pickup)
    except Postpone as wait:
        log.info("run %s: postponed %ss (%s)", row.id, wait.delay.total_seconds(), wait.reason)
        publish(
            definition,
            row.id,
            job_id(definition.id, row.identity, row.id),
            row.priority,
            delay=wait.delay,
        )
        return
    if not _claim(definition, row, pickup.owner):
        lifecycle.release(pickup)
        return
    outcome = _execute(definition, row, pickup.owner)
    lifecycle.finished(outcome)


def _execute(definition: TaskDefinition, row: TaskHistory, owner: str) -> Outcome:
    def end(target: RunState, kind: ErrorKind | None = None, message: str = "") -> Outcome:
        error = None if kind is None else _error(kind, message)
        ended = _finish(row.id, owner, target, result=result, error=error)
        return Outcome(definition, row.id, owner, ended, None if ended != target else kind)

    result: Any = None
    try:
        model = definition.input_model.model_validate(row.input)
    except ValidationError as exc:
        return end(RunState.FAILED, ErrorKind.VALIDATION, str(exc))
    try:
        result = _jsonable(definition.execute(RunContext(row.id, model), model))
    except TaskError as exc:
        return end(RunState.FAILED, exc.kind, str(exc))
    except SoftTimeLimitExceeded:
        return end(
            RunState.FAILED,
            ErrorKind.TIMEOUT,
            f"passed its soft timeout of {definition.timeout.soft}",
        )
    except Exception as exc:
        log.exception("run %s: handler raised", row.id)
        return end(RunState.FAILED, ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")
    return end(RunState.COMPLETED)


def _error(kind: ErrorKind, message: str) -> dict[str, str]:
    return {"kind": kind.value, "message": message[:4000]}


def _jsonable(result: object) -> Any:
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    return result


def _claim(definition: TaskDefinition, row: TaskHistory, owner: str) -> bool:
    """pending → active in Valkey, then Postgres. False when the run is not ours to run."""
    try:
        live.claim(row.id, owner)
    except IllegalTransition as exc:
        if exc.current is None:
            # The live hash is gone (Valkey restarted or flushed): Postgres says pending, so
            # seed it again from the row and claim.
            live.seed(row.id, row.task_id, row.priority, tuple(row.stages))
            live.claim(row.id, owner)
        else:
            log.info("run %s: not claimed, live state is %s", row.id, exc.current)
            return False
    try:
        durable.transition(
            row.id,
            RunState.ACTIVE,
            owner_instance_id=owner,
            started_at=timezone.now(),
            attempts=row.attempts + 1,
        )
    except IllegalTransition as exc:
        # Postgres moved on (e.g. cancelled) between our read and the claim; it wins.
        log.info("run %s: claim lost to Postgres state %s", row.id, exc.current)
        if exc.current == RunState.CANCELLING:
            live.transition(row.id, RunState.CANCELLING, owner=owner)
            _finish_cancel(row.id)
            lifecycle.finished(Outcome(definition, row.id, owner, RunState.CANCELLED))
        return False
    return True


def _finish(
    run_id: str,
    owner: str,
    target: RunState,
    *,
    result: Any = None,
    error: dict[str, str] | None = None,
) -> RunState:
    """The terminal write: Postgres first, then Valkey, fenced by the claim's owner.

    Returns the state the run ended in: `target`, or cancelled when a cancel won the race.
    """
    now = timezone.now()
    try:
        durable.transition(run_id, target, result=result, error=error, finished_at=now)
    except IllegalTransition as exc:
        if exc.current == RunState.CANCELLING:
            # A cancel raced the handler's end: the run ends once, as cancelled.
            _finish_cancel(run_id)
            return RunState.CANCELLED
        raise
    live.transition(run_id, target, owner=owner)
    return target


def _finish_cancel(run_id: str) -> None:
    now = timezone.now()
    durable.transition(run_id, RunState.CANCELLED, finished_at=now)
    try:
        live.transition(run_id, RunState.CANCELLED)
    except IllegalTransition as exc:
        log.warning("run %s: cancelled in Postgres, live hash disagreed: %s", run_id, exc)


def _not_pending(definition: TaskDefinition, row: TaskHistory) -> None:
    if row.state == RunState.CANCELLING:
        # Cancelled before pickup: the claim refuses it and the cancel completes here.
        _finish_cancel(row.id)
        lifecycle.finished(Outcome(definition, row.id, "", RunState.CANCELLED))
    elif row.state in TERMINAL_RUN_STATES:
        log.info("run %s: already %s; duplicate message dropped", row.id, row.state)
    else:
        log.warning("run %s: redelivered while %s; dropped", row.id, row.state)


def _fail_unstarted(
    definition: TaskDefinition, row: TaskHistory, kind: ErrorKind, message: str
) -> None:
    now = timezone.now()
    durable.transition(row.id, RunState.FAILED, error=_error(kind, message), finished_at=now)
    try:
        live.transition(row.id, RunState.FAILED)
    except IllegalTransition as exc:
        log.warning("run %s: failed in Postgres, live hash disagreed: %s", row.id, exc)
    lifecycle.finished(Outcome(definition, row.id, "", RunState.FAILED, kind))
