"""Liveness authority: which active or cancelling runs are orphans, and ending them.

A run is an orphan when both stores say that nobody runs it any more:

1. Postgres: its heartbeat is older than the threshold, judged in SQL against the Postgres
   server's `now()` (`lumastra_heartbeat_stale`, the one definition every reader uses), so
   no host's clock takes part. The heartbeat is `task_history.heartbeat_at`
   (stamped by the run's watch thread with the Postgres clock); until the first one lands,
   `started_at`; for a run cancelled before it ever started, the moment of the cancel
   request (`updated_at`).
2. The state-hash guard: the live hash `task:run:active:<runId>` is gone (expired, lost with
   Valkey, or holding no live state), or its own `heartbeat_at` (Valkey's clock) is at least
   as old as the threshold, judged against Valkey's TIME. Until heartbeats reach the hash,
   its `updated_at` stands in.

A run that passes 1 but not 2, whose live hash still beats (say its Postgres heartbeat writes
fail), is kept and counted as `kept_alive`: one store alone never ends a run. And nothing here
moves a run out of an ended state, so a heartbeat that lands late cannot bring back a run
already failed.

An active orphan whose task takes runs back after a lost worker (`retry_on_worker_loss`) and
whose attempts are not spent is put back instead of ended (`runs.put_back`): active → pending,
fenced by its lost claim (owner, attempt count) and by the same heartbeat condition, with
error kind `orphaned` and the attempt kept on the row, its backoff as `not_before`, and its
message published again; a pipeline run's running stages go back to waiting the same way
(`runs.stage_attempts.put_back_lost_stages`) while the run stays active. Counted as `put_back`.

Otherwise an orphan is ended Postgres first, by compare-and-set: active → failed, cancelling →
cancelled (cancelling → failed is not a legal move: the cancel request wins), with error
`{"kind": "orphaned", "message": ..., "owner": ..., "heartbeat_age_s": ...}`; the message
gives the heartbeat's age, the threshold, the owner and what the live hash said. The UPDATE
(`durable.end_orphan`) repeats the heartbeat condition, so a heartbeat landing between the
check and the write keeps the run alive, and ends a pipeline run's stages with it. Then the
run is settled (`runs.terminal.settle`): the live hash follows (no owner fence, since its owner is
gone; a missing hash is fine), then the `finished` hooks give back the run's concurrency slot
and identity. An orphan can be retried like any failed run.

Options: the threshold (the reconciler passes LUMASTRA_ORPHAN_THRESHOLD_S, or
LUMASTRA_ORPHAN_BOOT_THRESHOLD_S at boot recovery) and the batch size. `candidates()` is the
one query a reconciler tick makes; it also returns the pending runs that
`orchestrator.recovery.pending` checks against the broker.

Not guaranteed:
- A run whose heartbeats stop reaching both stores for longer than the threshold, though its
  process lives (SIGSTOP, a network partition), is failed. When it resumes, its late writes are
  refused by the claim's owner fence and the guarded UPDATEs; stopping that process is the
  watchdog's business, not this module's.
- While the hash's `updated_at` stands in for its heartbeat, it is the writing host's clock,
  and clock skew shifts the guard by the skew.
- Each batch is bounded; a backlog of orphans larger than the batch takes several ticks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from django.db import connection

from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.locks import Fence, LockLost
from orchestrator.runs import put_back, retries, stage_attempts, terminal
from orchestrator.runs.ending import End, Guard, Written
from orchestrator.states import RunState
from orchestrator.stores import keys, queries, valkey
from tasks import registry
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

# Where a pending-run scan starts over: before any run.
SCAN_START = (datetime(1970, 1, 1, tzinfo=UTC), "")


@dataclass(frozen=True)
class Candidate:
    run_id: str
    task_id: str
    state: RunState
    owner: str
    identity: str
    priority: int
    processing_version: int
    created_at: datetime
    # Seconds, by the Postgres clock: since the last heartbeat (active, cancelling), or since
    # the run became pending (pending).
    age_s: float
    attempts: int = 0  # claims so far (the lost attempt's number, for an active run)
    pipeline: bool = False


@dataclass(frozen=True)
class LiveView:
    """What the live hash says about a run, and Valkey's clock when it was read."""

    state: str | None
    owner: str
    heartbeat_ms: int | None  # heartbeat_at, else updated_at; None when neither is there
    now_ms: int

    def stale_reason(self, threshold_s: int) -> str | None:
        """Why the guard confirms the run is gone, or None when the hash says it lives."""
        if self.state not in (RunState.ACTIVE, RunState.CANCELLING, RunState.PENDING):
            return "live hash gone"
        if self.heartbeat_ms is None:
            return "live hash without a heartbeat"
        age_s = (self.now_ms - self.heartbeat_ms) / 1000
        if age_s >= threshold_s:
            return f"live hash heartbeat {age_s:.0f}s old"
        return None


@dataclass
class OrphanReport:
    put_back: int = 0  # active → pending for the next attempt (a pipeline: its running stages)
    orphaned: int = 0  # active → failed
    cancelled: int = 0  # cancelling → cancelled
    kept_alive: int = 0  # stale in Postgres, but the live hash still beats
    raced: int = 0  # changed (or deleted) between the check and the write: left alone
    errors: int = 0  # logged with the run id


def candidates(
    *,
    stale_after_s: int,
    pending_after_s: int,
    limit: int,
    pending_after: tuple[datetime, str] = SCAN_START,
) -> tuple[list[Candidate], list[Candidate]]:
    """(stale active/cancelling runs, pending runs to check), in one query."""
    params: dict[str, Any] = {
        "stale_states": [RunState.ACTIVE.value, RunState.CANCELLING.value],
        "stale_after_s": stale_after_s,
        "pending_after_s": pending_after_s,
        "limit": limit,
        "after_created": pending_after[0],
        "after_id": pending_after[1],
    }
    with connection.cursor() as cursor:
        cursor.execute(queries.ORPHAN_CANDIDATES, params)
        rows = cursor.fetchall()
    found = [
        Candidate(
            r[0], r[1], RunState(r[2]), r[3], r[4], r[5], r[6], r[7], float(r[8]), r[9], r[10]
        )
        for r in rows
    ]
    stale = [c for c in found if c.state != RunState.PENDING]
    pending = [c for c in found if c.state == RunState.PENDING]
    return stale, pending


def live_views(run_ids: Sequence[str]) -> dict[str, LiveView | Exception]:
    """The live hashes of `run_ids`, read in one round trip with Valkey's clock. A key that
    cannot be read (not a hash) gives its error, for that run alone."""
    pipe = valkey.client().pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hmget(keys.run_active(run_id), ["state", "owner", "heartbeat_at", "updated_at"])
    pipe.time()
    *hashes, server_time = valkey.execute(pipe, raise_on_error=False)
    now_ms = valkey.time_ms(server_time)
    views: dict[str, LiveView | Exception] = {}
    for run_id, found in zip(run_ids, hashes, strict=True):
        if isinstance(found, Exception):
            views[run_id] = found
            continue
        state, owner, heartbeat_at, updated_at = found
        beat = heartbeat_at or updated_at
        try:
            views[run_id] = LiveView(state, owner or "", int(beat) if beat else None, now_ms)
        except ValueError as exc:
            views[run_id] = exc
    return views


def end_orphans(
    stale: Sequence[Candidate],
    threshold_s: int,
    *,
    fence: Fence,
    clock: Clock = SYSTEM,
) -> OrphanReport:
    """Judge each stale run with the state-hash guard and end the orphans; each run alone."""
    report = OrphanReport()
    if not stale:
        return report
    views = live_views([c.run_id for c in stale])
    for candidate in stale:
        view = views[candidate.run_id]
        if isinstance(view, Exception):
            report.errors += 1
            log.error("run %s: live hash unreadable (%s); not judged", candidate.run_id, view)
            continue
        reason = view.stale_reason(threshold_s)
        if reason is None:
            report.kept_alive += 1
            log.warning(
                "run %s: Postgres heartbeat %.0fs old but the live hash still beats "
                "(%.0fs ago); kept",
                candidate.run_id,
                candidate.age_s,
                (view.now_ms - (view.heartbeat_ms or view.now_ms)) / 1000,
            )
            continue
        try:
            fence.check()
            ended = _end(candidate, threshold_s, reason, clock)
        except LockLost:
            raise
        except Exception:
            report.errors += 1
            log.exception(
                "run %s: could not end the orphan; next tick tries again", candidate.run_id
            )
            continue
        if ended is None:
            report.raced += 1
        elif ended == RunState.PENDING:
            report.put_back += 1
        elif ended == RunState.FAILED:
            report.orphaned += 1
        else:
            report.cancelled += 1
    return report


def _end(candidate: Candidate, threshold_s: int, reason: str, clock: Clock) -> RunState | None:
    """End the orphan, or put it back: PENDING for a run (or a pipeline run's stages) put back
    for its next attempt, None when it moved on since it was judged."""
    target = RunState.FAILED if candidate.state == RunState.ACTIVE else RunState.CANCELLED
    owner = candidate.owner or "no worker (never started)"
    message = (
        f"its worker stopped heartbeating: last heartbeat {candidate.age_s:.0f}s ago "
        f"(threshold {threshold_s}s), owner {owner}, {reason}"
    )
    if candidate.state == RunState.ACTIVE:
        done = _put_back(candidate, threshold_s, message)
        if done is _PutBack.PUT_BACK:
            return RunState.PENDING
        if done is _PutBack.MOVED_ON:
            return None
    end = End(
        candidate.run_id,
        candidate.task_id,
        target,
        candidate.owner,
        error=_final_error(candidate, message),
        guard=Guard.ORPHAN,
        stale_after_s=threshold_s,
    )
    # Its owner is gone, so the live hash follows without a fence (`Guard.ORPHAN`).
    ended = terminal.finish(end, clock=clock)
    if ended.written is Written.SUPERSEDED:
        log.info("run %s: changed since it was judged an orphan; left alone", candidate.run_id)
        return None
    log.warning("run %s: orphan %s: %s", candidate.run_id, target.value, message)
    return target


def _final_error(candidate: Candidate, message: str) -> dict[str, Any]:
    """An orphan that ends: a cancelled one says the cancel came first; a failed one is
    judged by the one retry rule (`runs.retries`), a dead letter when its attempts are spent.
    (A pipeline's attempts are its stages': the stage that may not be tried again was judged
    by the same rule, `stage_attempts.put_back_lost_stages`.)"""
    extra = {"owner": candidate.owner, "heartbeat_age_s": round(candidate.age_s)}
    if candidate.state != RunState.ACTIVE:
        return retries.error_doc(ErrorKind.ORPHANED, f"cancel requested, and {message}", **extra)
    definition = registry.get().get(candidate.task_id)
    if definition is None or candidate.pipeline:
        return retries.error_doc(ErrorKind.ORPHANED, message, **extra)
    return retries.decide(
        ErrorKind.ORPHANED,
        message,
        candidate.attempts,
        definition.retry,
        retry_on_worker_loss=definition.retry_on_worker_loss,
        **extra,
    ).error


class _PutBack(Enum):
    """What `_put_back` did with an orphan."""

    PUT_BACK = "put back"  # pending for its next attempt
    MOVED_ON = "moved on"  # changed since it was judged: left alone
    NOT_ALLOWED = "not allowed"  # may not be tried again: the caller ends it as an orphan


def _put_back(candidate: Candidate, threshold_s: int, message: str) -> _PutBack:
    """Put an orphan back for its next attempt (`runs.put_back`; a pipeline run's running
    stages, `stage_attempts.put_back_lost_stages`) while its task allows it."""
    definition = registry.get().get(candidate.task_id)
    if definition is None:
        return _PutBack.NOT_ALLOWED
    if candidate.pipeline:
        moved = stage_attempts.put_back_lost_stages(
            definition, candidate.run_id, message, threshold_s
        )
        if moved is None:
            return _PutBack.NOT_ALLOWED
        return _PutBack.PUT_BACK if moved else _PutBack.MOVED_ON
    if not put_back.may_put_back(definition, candidate.attempts):
        return _PutBack.NOT_ALLOWED
    lost = put_back.Lost(
        candidate.run_id,
        candidate.owner,
        candidate.attempts,
        candidate.identity,
        candidate.priority,
    )
    if put_back.put_back(definition, lost, ErrorKind.ORPHANED, message, stale_after_s=threshold_s):
        return _PutBack.PUT_BACK
    return _PutBack.MOVED_ON
