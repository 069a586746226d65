"""Ending a run: the terminal write in both stores, Postgres first, exactly once.

Whoever ends a run — the runner when the handler returns, the watchdog on a stall or hard
timeout, the cancel escalation — goes through here, and only the writer whose guarded
Postgres UPDATE succeeded settles the run (`runs.settle`: Valkey follows, the `finished`
hooks run). A writer that finds the run already ended (someone else won) writes nothing more.
"""

from __future__ import annotations

import logging
import traceback
from datetime import UTC, datetime
from typing import Any

from django.db import InterfaceError, OperationalError
from django.utils import timezone

from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Pickup
from orchestrator.models import TaskHistory
from orchestrator.runs import drain
from orchestrator.runs.settle import settle
from orchestrator.states import TERMINAL_RUN_STATES, IllegalTransition, RunState
from orchestrator.stores import durable, live
from orchestrator.stores.durable import ClaimedRun
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)


# A crash's traceback is kept on the error, its last lines only: the frames nearest the raise.
TRACEBACK_MAX_CHARS = 4000


def traceback_tail(exc: BaseException) -> str:
    """The end of `exc`'s formatted traceback, for an error document: operators see where a
    handler crashed without the worker's log."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    return text if len(text) <= TRACEBACK_MAX_CHARS else "…" + text[-TRACEBACK_MAX_CHARS:]


# An error's message is kept to this many characters.
MESSAGE_MAX_CHARS = 4000


def error_doc(kind: ErrorKind, message: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind.value, "message": message[:MESSAGE_MAX_CHARS], **extra}


def end(
    definition: TaskDefinition,
    run_id: str,
    owner: str,
    target: RunState,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
    step: dict[str, Any] | None = None,
    progress: dict[str, Any] | None = None,
    attempt: int | None = None,
    started_at: datetime | None = None,
) -> RunState:
    """End a claimed run in `target`; returns the state it really ended in (a cancel that
    raced the handler wins: cancelled; a watchdog that ended it first: its state). `step`:
    a plain run's warnings, counters, cost and log tail (`runs.steps.plain_extras`);
    `progress`: its latest progress (`runs.progress`); `attempt`: the attempt count `owner`'s
    claim returned, so the end also lands if that claim is not in Postgres (not written yet, or
    lost in a crash), with `started_at`, when the claim was taken (`durable.end`)."""
    kind = ErrorKind(error["kind"]) if error else None
    args: dict[str, Any] = {
        "finished_at": timezone.now(),
        "result": result,
        "error": error,
        "step": step,
        "progress": progress,
        "attempt": attempt,
        "started_at": started_at,
    }
    try:
        durable.end(run_id, target, owner=owner, **args)
    except (OperationalError, InterfaceError):
        # Postgres is away: the drain replays this same call, then settles the run itself,
        # so Valkey is never ahead of Postgres.
        log.warning("run %s: terminal write %s deferred to the drain", run_id, target)
        if not drain.push(run_id, target, args, owner):
            log.error("run %s: terminal write %s lost; the reconciler will end it", run_id, target)
        return target
    except IllegalTransition as exc:
        if exc.current in TERMINAL_RUN_STATES:
            log.info("run %s: already ended %s; %s not recorded", run_id, exc.current, target)
            return RunState(exc.current)
        if exc.current is not None and not still_ours(run_id, owner):
            # Put back to pending after this claim's worker was judged lost (`runs.put_back`),
            # and perhaps claimed again since: the run is another attempt's now.
            log.warning(
                "run %s: no longer ours (%s, claimed anew); %s not recorded",
                run_id,
                exc.current,
                target,
            )
            # What this claim took (its concurrency slot) is not the next attempt's to keep.
            hooks.release(Pickup(definition, run_id, owner))
            return RunState(exc.current)
        if exc.current == RunState.CANCELLING:
            cancel(definition, run_id, owner)
            return RunState.CANCELLED
        raise
    settle(run_id, definition.id, target, owner=owner, error_kind=kind)
    return target


def still_ours(run_id: str, owner: str) -> bool:
    """Postgres still names `owner` as the run's claim ('' claims nothing and is always
    answered yes)."""
    if not owner:
        return True
    found = TaskHistory.objects.filter(id=run_id).values_list("owner_instance_id", flat=True)
    return found.first() == owner


def write_live_claim(run_id: str, owner: str | None = None) -> ClaimedRun | None:
    """Postgres says pending while Valkey says a worker (`owner`, or whichever it names) runs
    the run: that worker's claim is written, started and last heard of when Valkey says. Either
    the claim is not written yet (a short run's is folded into its end:
    `durable.read_claimable`) or its commit, which does not wait for its flush
    (`stores/sql/claim_run.sql`), was lost in a crash of Postgres. Its owner's heartbeat calls
    this (`runs.watch`); so does a cancel, which must reach the handler rather than end the run
    under it (`runs.cancel`), and whoever finds the owner gone, so the lost attempt is counted
    and put back (or failed) as any other (`runs.runner`, `recovery.pending`). None, and nothing
    written, when Valkey does not say so or Postgres no longer calls the run pending."""
    held = live.read(run_id)
    holder = held.get("owner", "")
    if held.get("state") != RunState.ACTIVE or not holder or owner not in (None, holder):
        return None
    started_at = _moment(held.get("started_at"))
    heard_at = _moment(held.get("heartbeat_at")) or started_at
    claimed = durable.claim(run_id, holder, started_at=started_at, heard_at=heard_at)
    if claimed is not None:
        log.info("run %s: claim by %s written to Postgres", run_id, holder)
    return claimed


def _moment(valkey_ms: object) -> datetime | None:
    text = str(valkey_ms or "")
    return datetime.fromtimestamp(int(text) / 1000, tz=UTC) if text.isdigit() else None


def cancel(
    definition: TaskDefinition,
    run_id: str,
    owner: str = "",
    *,
    error: dict[str, Any] | None = None,
) -> None:
    """cancelling → cancelled, Postgres first; a no-op if the run has already ended."""
    try:
        durable.end_cancelled(run_id, finished_at=timezone.now(), error=error)
    except IllegalTransition as exc:
        log.info("run %s: not cancelled, Postgres says %s", run_id, exc.current)
        return
    kind = ErrorKind(error["kind"]) if error else None
    settle(run_id, definition.id, RunState.CANCELLED, owner=owner, error_kind=kind)


def fail_unstarted(definition: TaskDefinition, run_id: str, kind: ErrorKind, message: str) -> None:
    """pending → failed for a run refused before it ever started."""
    durable.end(run_id, RunState.FAILED, finished_at=timezone.now(), error=error_doc(kind, message))
    settle(run_id, definition.id, RunState.FAILED, error_kind=kind)
