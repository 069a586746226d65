"""A claimed run's execution: the handler under its watch, then how the run ends.

A pipeline run's first message dispatches its first stages (`runs.pipeline.begin`). A plain
run's handler runs beside its watch thread (heartbeats, cancel listener, watchdogs), and its
outcome decides the end: completed with its result; failed with the error's kind and message;
a transient error with attempts left put back to pending, its message published again after
the retry policy's backoff; a transient error on the last attempt failed as exhausted, a dead
letter (the one rule: `runs.retries`). Every end goes through `runs.terminal`, Postgres first.

`outcome_of` makes a handler's call (inside whatever the caller wraps around it: the run's
watch) and turns each way it can end into an `Outcome`, read one way for plain runs and
pipeline stages alike: the handler's result; a `TaskError`'s own kind and message (a cancel
is one, `RunCancelled`); the soft time limit, as `timeout`; any other exception, as
`internal`, logged with its traceback, whose tail the error keeps. What each path then writes
(a run's end or put-back, a stage's move) stays with that path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from orchestrator import tracing
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Pickup
from orchestrator.runs import catch_up, pipeline, retries, spawn, terminal
from orchestrator.runs.context import RunContext
from orchestrator.runs.ending import End
from orchestrator.runs.publish import republish
from orchestrator.runs.watch import watching
from orchestrator.states import IllegalTransition, RunState
from orchestrator.stores import durable, live
from orchestrator.stores.durable import ClaimedRun
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind, TaskError

log = logging.getLogger(__name__)


def run_claimed(definition: TaskDefinition, run: ClaimedRun, pickup: Pickup) -> None:
    if tracing.ON:
        tracing.claimed({"lumastra.attempt": run.attempts})
    try:
        if definition.pipeline:
            pipeline.begin(definition, run, pickup.owner)
        else:
            _execute(definition, run, pickup)
    except Exception:
        # The terminal write itself failed (the reconciler will end the run): the slot
        # is not held for the rest of its lease meanwhile.
        hooks.release(pickup)
        raise


def _execute(definition: TaskDefinition, run: ClaimedRun, pickup: Pickup) -> None:
    try:
        model = definition.input_model.model_validate(run.input)
    except ValidationError as exc:
        error = retries.error_doc(ErrorKind.VALIDATION, str(exc))
        _end(definition, run, pickup, RunState.FAILED, error=error)
        return
    context = RunContext(run.run_id, model, task_id=definition.id, priority=run.priority)
    handler = definition.execute
    assert handler is not None  # a task without a pipeline has one

    def call() -> Any:
        with watching(
            definition,
            run.run_id,
            pickup.owner,
            context,
            run.attempts,
            run.deferred_since,
            priority=run.priority,
        ):
            return _jsonable(handler(context, model))

    outcome = outcome_of(
        call, soft_timeout=definition.timeout.soft, what=f"run {run.run_id}: handler"
    )
    if outcome.kind is None:
        _end(definition, run, pickup, RunState.COMPLETED, context, result=outcome.result)
        return
    spawn.abandon(context.spawned)  # a failed attempt writes no children
    if outcome.kind == ErrorKind.CANCELLED and context.stopped_for_window:
        message = "stopped as its run window closed; it goes on in the next window"
        error = retries.error_doc(ErrorKind.WINDOW_CLOSED, message)
        _retry_later(definition, run, pickup, error, timedelta(0), message, refund=True)
        return
    if outcome.kind == ErrorKind.LIMITED and context.limited_for is not None:
        error = retries.error_doc(ErrorKind.LIMITED, outcome.message)
        _retry_later(
            definition, run, pickup, error, context.limited_for, outcome.message, refund=True
        )
        return
    decision = retries.decide(
        outcome.kind,
        outcome.message,
        run.attempts,
        definition.retry,
        retry_on_worker_loss=definition.retry_on_worker_loss,
        **outcome.extra,
    )
    if decision.delay is not None:
        _retry_later(definition, run, pickup, decision.error, decision.delay, outcome.message)
    else:
        _end(definition, run, pickup, RunState.FAILED, context, error=decision.error)


def _end(
    definition: TaskDefinition,
    run: ClaimedRun,
    pickup: Pickup,
    target: RunState,
    context: RunContext | None = None,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
) -> None:
    """The run's terminal write, with its step's telemetry and last progress when it ran."""
    step, progress = context.extras() if context is not None else (None, None)
    spawned = context.spawned if context is not None else []
    children = None
    if spawned and target is RunState.COMPLETED:
        children = spawn.Children(spawn.Parent(run.run_id, "", run.priority), spawned)
    elif spawned:
        spawn.abandon(spawned)
    end = End(
        run.run_id,
        definition.id,
        target,
        pickup.owner,
        result=result,
        error=error,
        step=step,
        progress=progress,
        attempt=run.attempts,
        started_at=run.deferred_since,
        children=children,
    )
    with tracing.ending(target.value) if tracing.ON else tracing.OFF:
        terminal.finish(end)


def _retry_later(
    definition: TaskDefinition,
    run: ClaimedRun,
    pickup: Pickup,
    error: dict[str, Any],
    delay: timedelta,
    message: str,
    *,
    refund: bool = False,
) -> None:
    """The run back to pending for its next attempt after `delay`; with `refund`, this
    attempt is not counted (a stop at its window's close: it did not fail)."""
    with tracing.ending("retrying") if tracing.ON else tracing.OFF:
        attempt = run.attempts
        if run.deferred_since is not None:
            # Put back moves a claimed run: its claim is written first, if the watch has not.
            catch_up.write_live_claim(run.run_id, pickup.owner)
        try:
            durable.put_back(
                run.run_id,
                owner=pickup.owner,
                attempts=run.attempts,
                error=error,
                # A refunded run is a fresh one again (no attempt spent): no not_before, or the due
                # loop would take it for a delayed start (`runs.due`).
                not_before=None if refund else timezone.now() + delay,
                refund=refund,
            )
        except IllegalTransition as exc:
            if exc.current is not None and not terminal.still_ours(run.run_id, pickup.owner):
                log.warning(
                    "run %s: no longer ours (%s); retry not recorded", run.run_id, exc.current
                )
                hooks.release(pickup)
                return
            if exc.current == RunState.CANCELLING:
                terminal.cancel(definition, run.run_id, pickup.owner)
                return
            raise
        live.transition(run.run_id, RunState.PENDING, owner=pickup.owner)
        hooks.release(pickup)
        spent = "not spent" if refund else "spent"
        log.info(
            "run %s: attempt %s (%s) back in %s: %s", run.run_id, attempt, spent, delay, message
        )
        republish(definition, run.run_id, run.identity, run.priority, delay)


def _jsonable(result: object) -> Any:
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    return result


@dataclass(frozen=True)
class Outcome:
    result: Any = None
    kind: ErrorKind | None = None  # None: the call returned `result`
    message: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # an internal error's traceback


def outcome_of(call: Callable[[], Any], *, soft_timeout: timedelta, what: str) -> Outcome:
    """Make the handler's `call`; `what` names it in the log ("run <id>: handler")."""
    try:
        with tracing.span("lumastra.handler") if tracing.ON else tracing.OFF:
            return Outcome(result=call())
    except TaskError as exc:
        return Outcome(kind=exc.kind, message=str(exc))
    except SoftTimeLimitExceeded:
        return Outcome(kind=ErrorKind.TIMEOUT, message=f"passed its soft timeout of {soft_timeout}")
    except Exception as exc:
        log.exception("%s raised", what)
        return Outcome(
            kind=ErrorKind.INTERNAL,
            message=f"{type(exc).__name__}: {exc}",
            extra={"traceback": retries.traceback_tail(exc)},
        )
