"""Ending a run: the terminal write in both stores, Postgres first, exactly once.

Whoever ends a run — the runner when the handler returns, the watchdog on a stall or hard
timeout, the cancel escalation — goes through here, and only the writer whose guarded
Postgres UPDATE succeeded runs the `finished` hooks. A writer that finds the run already
ended (someone else won) writes nothing more.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import InterfaceError, OperationalError
from django.utils import timezone
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Outcome
from orchestrator.runs import drain
from orchestrator.states import TERMINAL_RUN_STATES, IllegalTransition, RunState
from orchestrator.stores import durable, live
from orchestrator.stores.live import FencedWrite
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

# Valkey unreachable when the live hash should follow a Postgres terminal write (a restart, a
# failover): the mirror is tried again for about three seconds (0.1 s doubling) before the
# hash is left behind, so a blip does not leave a live hash saying `active` for a run Postgres
# has ended. Repeating it is safe: a transition that did land is refused the second time.
MIRROR_ATTEMPTS = 6
MIRROR_FIRST_PAUSE_S = 0.1


def error_doc(kind: ErrorKind, message: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind.value, "message": message[:4000], **extra}


def finish(
    definition: TaskDefinition,
    run_id: str,
    owner: str,
    target: RunState,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
) -> RunState:
    """End a claimed run in `target`; returns the state it really ended in (a cancel that
    raced the handler wins: cancelled; a watchdog that ended it first: its state)."""
    kind = ErrorKind(error["kind"]) if error else None
    fields = {"result": result, "error": error, "finished_at": timezone.now()}
    try:
        durable.transition(run_id, target, **fields)
    except (OperationalError, InterfaceError):
        # Postgres is away: the drain replays the write, then mirrors Valkey and runs the
        # hooks itself, so Valkey is never ahead of Postgres.
        log.warning("run %s: terminal write %s deferred to the drain", run_id, target)
        if not drain.push(run_id, target, fields, owner):
            log.error("run %s: terminal write %s lost; the reconciler will end it", run_id, target)
        return target
    except IllegalTransition as exc:
        if exc.current == RunState.CANCELLING:
            cancel(definition, run_id, owner)
            return RunState.CANCELLED
        if exc.current in TERMINAL_RUN_STATES:
            log.info("run %s: already ended %s; %s not recorded", run_id, exc.current, target)
            return RunState(exc.current)
        raise
    _mirror(run_id, target, owner)
    hooks.finished(Outcome(definition, run_id, owner, target, kind))
    return target


def cancel(
    definition: TaskDefinition,
    run_id: str,
    owner: str = "",
    *,
    error: dict[str, Any] | None = None,
) -> None:
    """cancelling → cancelled, Postgres first; a no-op if the run has already ended."""
    fields: dict[str, Any] = {"finished_at": timezone.now()}
    if error is not None:
        fields["error"] = error
    try:
        durable.transition(run_id, RunState.CANCELLED, **fields)
    except IllegalTransition as exc:
        log.info("run %s: not cancelled, Postgres says %s", run_id, exc.current)
        return
    _mirror(run_id, RunState.CANCELLED, owner)
    kind = ErrorKind(error["kind"]) if error else None
    hooks.finished(Outcome(definition, run_id, owner, RunState.CANCELLED, kind))


def fail_unstarted(definition: TaskDefinition, run_id: str, kind: ErrorKind, message: str) -> None:
    """pending → failed for a run refused before it ever started."""
    durable.transition(
        run_id, RunState.FAILED, error=error_doc(kind, message), finished_at=timezone.now()
    )
    _mirror(run_id, RunState.FAILED, "")
    hooks.finished(Outcome(definition, run_id, "", RunState.FAILED, kind))


def _mirror(run_id: str, target: RunState, owner: str) -> None:
    """Valkey follows Postgres. A hash that disagrees (lost in a restart, moved on by an
    operator) cannot undo the Postgres write, so it is logged, not raised; neither can Valkey
    being unreachable, which is retried for a while, then logged."""
    for attempt in range(MIRROR_ATTEMPTS):
        try:
            _mirror_once(run_id, target, owner)
            return
        except (ValkeyConnectionError, ValkeyTimeoutError) as exc:
            if attempt == MIRROR_ATTEMPTS - 1:
                log.error(
                    "run %s: %s in Postgres; live hash not updated, Valkey unreachable: %s",
                    run_id,
                    target,
                    exc,
                )
                return
            time.sleep(MIRROR_FIRST_PAUSE_S * 2**attempt)


def _mirror_once(run_id: str, target: RunState, owner: str) -> None:
    try:
        live.transition(run_id, target, owner=owner)
    except FencedWrite as exc:
        log.warning("run %s: %s; live hash left to its owner", run_id, exc)
    except IllegalTransition as exc:
        if exc.current == RunState.ACTIVE and target == RunState.CANCELLED:
            live.transition(run_id, RunState.CANCELLING)
            live.transition(run_id, RunState.CANCELLED)
            return
        log.warning("run %s: %s in Postgres, live hash disagreed: %s", run_id, target, exc)
