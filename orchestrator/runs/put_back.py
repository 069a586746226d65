"""Resuming interrupted work: a run whose worker was lost goes back to `pending`, the same run.

A run's worker can be lost mid-run in several ways, each found by its own path:
- a pool child killed (SIGKILL, `os._exit`, the OOM killer, a hard kill at a pool recycle):
  Celery rejects its message back to the queue (`reject_on_worker_lost`) and the runner,
  given it again, finds the run's owner dead on this host or silent (`runs.runner`);
- a whole worker or host gone: the reconciler finds the run's heartbeat stale in both stores
  (`recovery.orphans`);
- a worker shut down before the run finished: the worker hands the run back after its grace
  (`runs.handback`).

Each calls `put_back` while the task allows it (`retry_on_worker_loss`, True by default) and
its attempts are not spent (`Retry.max_attempts` counts every attempt, whatever ended it;
`may_put_back`, by the one retry rule, `runs.retries`). Then, in this order:

1. Postgres, one guarded UPDATE (`durable.put_back`): active → pending, fenced by the lost
   claim: the run is still active, still that owner's, still at that attempt count (and, for
   the reconciler, its heartbeat still older than the threshold, by the Postgres clock), so a
   claim that came meanwhile or a heartbeat that landed keeps it as it is. The owner is
   cleared, `not_before` is the backoff (`Retry`, jittered, as for a TransientError), and the
   lost attempt's error (kind `worker_lost` or `orphaned`, with the attempt and the lost
   owner) stays on the row until the run's end replaces it.
2. The live hash follows (active → pending, fenced by the lost owner). A lost hash is left
   lost: the next pickup seeds it again from the row.
3. What the lost claim held is given back (`hooks.release`: its concurrency slot, its rate
   entry).
4. The run's message is published again, with the backoff as its delay.

The next claim counts the next attempt (`attempts + 1`) under a new owner. A process of the
lost claim that is in fact alive (stopped, cut off) can no longer write for the run: its
heartbeat finds the hash pending or owned by another and kills its handler (`runs.watch`),
and its terminal write, TransientError retry or stage end is refused by the owner fence of
the guarded UPDATEs (`end_run.sql`, `put_back_run.sql`, `move_stage.sql`).

When the attempts are spent, or the task opted out, the caller fails the run as before; a
`worker_lost` end counts toward the task's circuit breaker, so a payload that keeps killing
its worker still ends failed and opens the circuit.

Not guaranteed: a process of the lost claim that was stopped (SIGSTOP), not dead, still holds
its handler mid-call; when it wakes, the handler runs until its next heartbeat or its
terminal write, whichever comes first, possibly beside the new attempt. Its writes are
refused; its effects outside the engine are the task's business (`retry_on_worker_loss=False`
for work that must never repeat). A publish that fails leaves the run pending for the
reconciler's pending check to publish again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.utils import timezone

from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Pickup
from orchestrator.runs import retries, terminal
from orchestrator.runs.publish import republish
from orchestrator.states import IllegalTransition, RunState
from orchestrator.stores import durable, live
from orchestrator.stores.live import FencedWrite
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lost:
    """A claim whose worker is gone, as the row named it when it was judged lost."""

    run_id: str
    owner: str
    attempts: int  # the lost attempt's number (the claim counted it)
    identity: str
    priority: int


def may_put_back(definition: TaskDefinition, attempts: int) -> bool:
    """The task takes runs back after a lost worker, and the lost attempt was not its last."""
    return retries.may_retry(
        ErrorKind.WORKER_LOST,
        attempts,
        definition.retry,
        retry_on_worker_loss=definition.retry_on_worker_loss,
    )


def _decide(definition: TaskDefinition, lost: Lost, kind: ErrorKind, why: str) -> retries.Decision:
    return retries.decide(
        kind,
        why,
        lost.attempts,
        definition.retry,
        retry_on_worker_loss=definition.retry_on_worker_loss,
        owner=lost.owner,
        attempt=lost.attempts,
    )


def put_back(
    definition: TaskDefinition,
    lost: Lost,
    kind: ErrorKind,
    why: str,
    *,
    stale_after_s: float | None = None,
) -> bool:
    """active → pending for the lost claim's next attempt, then Valkey, the hooks and a new
    message (see the module docstring). With `stale_after_s`, only while the run's heartbeat
    is still that old by the Postgres clock. False, and nothing written, when the run moved on
    since it was judged (claimed anew, ended, beating again). The caller asked
    `may_put_back` first."""
    decision = _decide(definition, lost, kind, why)
    error, delay = decision.error, decision.delay
    assert delay is not None, "put back a run that may not be"
    try:
        durable.put_back(
            lost.run_id,
            owner=lost.owner,
            attempts=lost.attempts,
            error=error,
            not_before=timezone.now() + delay,
            stale_after_s=stale_after_s,
        )
    except IllegalTransition:
        log.info("run %s: moved on since its worker was judged lost; left alone", lost.run_id)
        return False
    log.warning(
        "run %s: %s; back to pending for attempt %s of %s in %.1fs",
        lost.run_id,
        why,
        lost.attempts + 1,
        definition.retry.max_attempts,
        delay.total_seconds(),
    )
    _follow(lost)
    try:
        hooks.release(Pickup(definition, lost.run_id, lost.owner))
    except Exception:
        # Its slot's lease still expires; the run must not wait for that to be delivered.
        log.exception("run %s: the lost claim's slot not given back", lost.run_id)
    try:
        republish(definition, lost.run_id, lost.identity, lost.priority, delay)
    except Exception:
        log.exception("run %s: not published again; the pending check will", lost.run_id)
    return True


def put_back_or_fail(definition: TaskDefinition, lost: Lost, why: str) -> RunState | None:
    """A run whose worker is known dead (its process gone from this host): put back for its
    next attempt while it may be, else failed as `worker_lost` (a dead letter when its
    attempts are spent, which counts toward the circuit breaker). Returns the state it moved
    to, or None when it had moved on."""
    if may_put_back(definition, lost.attempts):
        moved = put_back(definition, lost, ErrorKind.WORKER_LOST, why)
        return RunState.PENDING if moved else None
    error = _decide(definition, lost, ErrorKind.WORKER_LOST, why).error
    return terminal.end(definition, lost.run_id, lost.owner, RunState.FAILED, error=error)


def _follow(lost: Lost) -> None:
    """The live hash follows Postgres back to pending, fenced by the lost owner."""
    try:
        live.transition(lost.run_id, RunState.PENDING, owner=lost.owner)
    except IllegalTransition as exc:
        # Gone with Valkey (the pickup seeds it again) or moved by someone else; Postgres,
        # which just said pending, has the last word at the next claim.
        log.info("run %s: live hash not put back (%s)", lost.run_id, exc.current)
    except FencedWrite as exc:
        log.warning("run %s: live hash not put back: %s", lost.run_id, exc)
    except Exception:
        log.exception("run %s: live hash not put back", lost.run_id)
