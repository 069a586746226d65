"""Ending a run: the one owner of a run's end, in both stores, Postgres first, exactly once.

Whoever ends a run goes through `finish`: the runner when the handler returns, the watchdogs
(stall, hard timeout), a cancel or a kill, a lost worker's last attempt, the reconciler (an
orphan, a pending run past its deadline) and the drain replaying an end Postgres refused.
Only the writer whose guarded Postgres statement won settles the run; a cancel request that
raced a claim's end wins here, once; the error document is capped here. A writer that finds
the run already ended (someone else won) writes nothing more. `tests/unit/test_one_end.py`
fails when anything else ends a run.

`settle` brings Valkey to the end Postgres holds and runs the `finished` hooks (so does the
repair of a live hash left behind, `recovery.repair`):
- The live hash follows by one Lua transition (`end_run.lua`), fenced by the claim's owner
  where that owner is the caller (an orphan's or a repaired run's owner is gone: not fenced).
  The script counts the end (/metrics, the day count of a task without a cap) and publishes
  it to waiters, once: in the call that moves the hash, or that finds it lost.
- The move and the hooks' commands go in one pipeline: one Valkey round trip, and a task
  whose plan has no end hook sends the move alone. A hook the script may excuse
  (`RunHook.excused_at_end`: the circuit) hears of a completion only when the script says it
  must, in a second round trip; of any other end, with the move. A repair, a cancel the hash
  never heard of, or an outage take the slow path (`runs.catch_up.follow`: the move alone,
  retried, then the hooks). The hooks run once per end: the caller is the writer whose
  guarded Postgres UPDATE won, or, for a repair (`only_if_moved`), the process whose
  transition moved the hash.

Not guaranteed: a completion's circuit record, when the end's script asks for it, is a call
of its own after the move: if Valkey fails just then, it is logged and not retried (a probe's
success then closes nothing, and its slot runs out for the next probe; a reset of the failure
count is lost). A writer whose Valkey stayed unreachable past the retries runs its hooks
anyway, and the repair that later moves the hash runs them again; so does a writer whose
pipeline was cut after Valkey ran it. Hooks are idempotent except a capped task's daily
completed/failed counts (Postgres), which can count that run twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from redis.client import Pipeline
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Outcome, Part, Pickup
from orchestrator.models import TaskHistory
from orchestrator.runs import catch_up, drain
from orchestrator.runs.ending import End, Ended, Guard, Replay, Written
from orchestrator.runs.retries import MESSAGE_MAX_CHARS, error_doc
from orchestrator.states import TERMINAL_RUN_STATES, IllegalTransition, RunState
from orchestrator.stores import durable, live
from orchestrator.stores.live import FencedWrite
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)


def finish(end: End, *, replay: Replay | None = None, clock: Clock = SYSTEM) -> Ended:
    """The one way a run ends, whoever ends it: the runner, the watchdogs, a cancel or a kill,
    a lost worker, the reconciler (orphans, the pending deadline) and the drain's replay.

    Postgres first, one guarded statement (`End.guard` says which); a cancel request that
    raced a claim's end wins here, once: the run ends cancelled. Then, only for the writer
    whose statement won, the run is settled (`settle`: the live hash follows, the
    `finished` hooks hear of it). Postgres away: a claim's end waits in the drain (a replay
    raises instead). A refused end writes nothing more; a claim that lost its run gives back
    what it took."""
    error = end.error
    if error is not None and len(str(error.get("message", ""))) > MESSAGE_MAX_CHARS:
        capped = {**error, "message": str(error["message"])[:MESSAGE_MAX_CHARS]}
        end = dataclasses.replace(end, error=capped)
    args = {name: getattr(end, name) for name in drain.END_ARGS}  # `durable.end`'s
    children = end.children
    within = transaction.atomic if children else contextlib.nullcontext
    wrote = False  # the children are in the end's transaction: kept once it commits
    try:
        with replay.transaction() if replay else within():
            try:
                if end.guard is Guard.ORPHAN:
                    source = (
                        RunState.ACTIVE if end.target is RunState.FAILED else RunState.CANCELLING
                    )
                    durable.end_orphan(
                        end.run_id, source, error=args["error"], stale_after_s=end.stale_after_s
                    )
                elif end.guard is Guard.PENDING_DEADLINE:
                    durable.fail_pending(
                        end.run_id, error=args["error"], older_than_s=end.stale_after_s
                    )
                elif end.target is RunState.CANCELLED:
                    durable.end_cancelled(end.run_id, finished_at=end.finished_at, error=end.error)
                else:
                    durable.end(end.run_id, end.target, owner=end.owner, **args)
                    if children is not None:
                        children.write()
                        wrote = True
                ended = Ended(Written.APPLIED, end.target)
            except IllegalTransition as exc:
                if not _cancel_wins(end, exc):
                    raise
                durable.end_cancelled(end.run_id, finished_at=end.finished_at)
                ended = Ended(Written.CANCELLED, RunState.CANCELLED)
        if wrote:
            children = None  # committed with the end
    except drain.TRANSIENT_ERRORS:
        if replay is not None or end.guard is not Guard.CLAIM:
            raise
        if children is not None:
            log.error("run %s: its end and its children not written; Postgres away", end.run_id)
            return Ended(Written.UNWRITTEN, None)  # given back below
        return _deferred(end, args)
    except IllegalTransition as exc:
        ended = _refused(end, exc, replay)
        if ended.written is not Written.ALREADY:
            return ended
    finally:
        if children is not None:
            children.abandon()  # not written with the end: a cancel won, or it was refused
    kind = None
    if ended.written is not Written.CANCELLED and end.error:
        kind = ErrorKind(end.error["kind"])
    settle(
        end.run_id,
        end.task_id or _task_of(end.run_id),
        end.target if ended.written is not Written.CANCELLED else RunState.CANCELLED,
        owner=end.owner,
        fenced=end.guard is Guard.CLAIM,
        error_kind=kind,
        clock=clock,
    )
    return ended


def _deferred(end: End, args: dict[str, Any]) -> Ended:
    """Postgres is away: the drain makes this same call once it is back, then settles the run
    itself, so Valkey is never ahead of Postgres."""
    ids = (end.run_id, end.target)
    log.warning("run %s: terminal write %s deferred to the drain", *ids)
    if not drain.push(end.run_id, end.target, args, end.owner):
        log.error("run %s: terminal write %s lost; the reconciler will end it", *ids)
    return Ended(Written.DEFERRED, end.target)


def _cancel_wins(end: End, exc: IllegalTransition) -> bool:
    """A cancel request reached the run before this claim's end: the run ends cancelled. So
    it does when the request came before Postgres heard of the claim at all (a first delivery
    that read nothing: its message carried the row, `runs.runner`)."""
    if (
        end.guard is not Guard.CLAIM
        or end.target is RunState.CANCELLED
        or exc.current != RunState.CANCELLING
    ):
        return False
    if end.attempt is not None:
        # A claim's end that names its attempt takes the claim with it if Postgres has not
        # heard of it: a row that names no claim is this one's too.
        return _claimed_by(end.run_id) in ("", end.owner)
    return still_ours(end.run_id, end.owner)


def _refused(end: End, exc: IllegalTransition, replay: Replay | None) -> Ended:
    current = RunState(exc.current) if exc.current else None
    run_id, target = end.run_id, end.target
    if replay is not None and current is target and replay.landed():
        return Ended(Written.ALREADY, current)
    if end.guard is not Guard.CLAIM or replay is not None or target is RunState.CANCELLED:
        log.info("run %s: %s not recorded, the run is %s now", run_id, target, exc.current)
        return Ended(Written.SUPERSEDED, current)
    if current in TERMINAL_RUN_STATES:
        log.info("run %s: already ended %s; %s not recorded", run_id, exc.current, target)
        return Ended(Written.SUPERSEDED, current)
    if current is None and end.attempt is not None:
        # No such run in Postgres: its row was lost after its message carried it out (a
        # restore, a failover that lost commits; `runs.runner`). Nothing to end, as the read
        # of a message for a run Postgres does not have drops it.
        log.error("run %s: Postgres does not have this run; %s not recorded", run_id, target)
        _give_back(end)
        return Ended(Written.SUPERSEDED, current)
    if current is not None and not still_ours(run_id, end.owner):
        # Put back to pending after this claim's worker was judged lost (`runs.put_back`),
        # and perhaps claimed again since: the run is another attempt's now.
        log.warning(
            "run %s: no longer ours (%s, claimed anew); %s not recorded", run_id, current, target
        )
        _give_back(end)
        return Ended(Written.SUPERSEDED, current)
    raise exc


def _give_back(end: End) -> None:
    """What this claim took (its concurrency slot) is not its run's next holder's to keep."""
    definition = registry.get().get(end.task_id or _task_of(end.run_id))
    if definition is not None:
        hooks.release(Pickup(definition, end.run_id, end.owner))


def _task_of(run_id: str) -> str:
    found = TaskHistory.objects.filter(id=run_id).values_list("task_id", flat=True).first()
    return found or ""


def settle(
    run_id: str,
    task_id: str,
    target: RunState,
    *,
    owner: str = "",
    fenced: bool = True,
    error_kind: ErrorKind | None = None,
    only_if_moved: bool = False,
    clock: Clock = SYSTEM,
) -> bool:
    """Postgres holds `target` for the run: move its live hash there and run the `finished`
    hooks. `owner` is the claim's owner (the hooks give back what that claim took); the move
    is fenced by it unless `fenced` is False (the owner is gone: an orphan, a repair). With
    `only_if_moved`, the hooks run only when this call moved the hash. Returns whether it did."""
    fence = owner if fenced else ""
    definition = registry.get().get(task_id)
    if definition is None:
        log.warning("run %s: task %r is not registered; hooks not told", run_id, task_id)
        return catch_up.follow(run_id, target, fence, live.EndCount(task_id), clock) is not None
    plan = hooks.plans.get(task_id)
    if plan is None or plan.definition is not definition:
        plan = hooks.plan(definition)
    # Only a completion can change nothing for the hooks the end's script may excuse (the
    # circuit): they hear of any other end with the move, as the other hooks do.
    excusable = plan.finished_asked if target is RunState.COMPLETED else ()
    with_move = plan.finished if excusable else plan.finished + plan.finished_asked
    counted = live.EndCount(task_id, not definition.quotas.capped, bool(excusable))
    outcome = Outcome(definition, run_id, owner, target, error_kind)
    if only_if_moved:
        ended = catch_up.follow(run_id, target, fence, counted, clock)
        if ended is None:
            return False
        hooks.finished(outcome, with_move + excusable if ended.circuit else with_move)
        return True
    # The common end: the hash's move (counted and announced by its script) alone, or with the
    # hooks' commands in one round trip; the excusable hooks after it, if the script asks.
    move = _Move(run_id, target, fence, counted, clock)
    if with_move:
        hooks.finished(outcome, with_move, first=Part(send=move.send, receive=move.receive))
    else:
        move.alone()
    if move.ended is not None:
        if move.ended.circuit:
            hooks.finished(outcome, excusable)
        return True
    if move.moved is not None:
        # Not moved here (a lost hash, another owner's): the script could not excuse anyone.
        hooks.finished(outcome, excusable)
        return move.moved
    # Valkey unreachable, or a cancel to take in two steps: the move alone, with retries;
    # after an outage every hook is told again (their commands may not have arrived).
    ended = catch_up.follow(run_id, target, fence, counted, clock)
    if move.unreachable:
        hooks.finished(outcome, with_move + excusable)
    elif ended is None or ended.circuit:
        hooks.finished(outcome, excusable)
    return ended is not None


class _Move:
    """The live hash's move: alone, or as the first command of the end-of-run pipeline."""

    def __init__(
        self, run_id: str, target: RunState, owner: str, counted: live.EndCount, clock: Clock
    ) -> None:
        self.run_id, self.target, self.owner, self.clock = run_id, target, owner, clock
        self.counted = counted
        self.ended: live.Ended | None = None  # moved, and what the script said
        self.moved: bool | None = None  # None: not decided here (see `settle`)
        self.unreachable = False
        self._read: Callable[[Any], live.Ended] | None = None

    def alone(self) -> None:
        try:
            reply = live.end(
                self.run_id, self.target, self.counted, owner=self.owner, clock=self.clock
            )
        except Exception as exc:
            self._refused(exc)
            return
        self.ended = reply

    def send(self, pipe: Pipeline) -> None:
        self._read = live.queue_end(
            pipe, self.run_id, self.target, self.counted, owner=self.owner, clock=self.clock
        )

    def receive(self, replies: list[Any]) -> None:
        assert self._read is not None
        (reply,) = replies
        try:
            self.ended = self._read(reply)  # raises what the reply says, an outage included
        except Exception as exc:
            self._refused(exc)

    def _refused(self, exc: Exception) -> None:
        """The move did not happen: why decides what `settle` does next (`moved`)."""
        if isinstance(exc, ValkeyConnectionError | ValkeyTimeoutError):
            self.unreachable = True
        elif isinstance(exc, IllegalTransition):
            if self.target == RunState.CANCELLED and exc.current in (
                RunState.PENDING,
                RunState.ACTIVE,
            ):
                return  # the two steps, by `catch_up.follow`
            catch_up.disagreed(self.run_id, self.target, exc)
            self.moved = False
        elif isinstance(exc, FencedWrite):
            log.warning("run %s: %s; live hash left to its owner", self.run_id, exc)
            self.moved = False
        else:
            log.error(
                "run %s: %s in Postgres; live hash not updated",
                self.run_id,
                self.target,
                exc_info=exc,
            )
            self.moved = False


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
    """A claim's end in `target` (`finish`); returns the state the run really ended in (a
    cancel that raced the handler wins: cancelled; a watchdog that ended it first: its
    state). `step`: a plain run's warnings, counters, cost and log tail
    (`RunContext.extras`); `progress`: its latest progress (`runs.progress`)."""
    ended = finish(
        End(
            run_id,
            definition.id,
            target,
            owner,
            error=error,
            result=result,
            step=step,
            progress=progress,
            attempt=attempt,
            started_at=started_at,
        )
    )
    return ended.state or target


def still_ours(run_id: str, owner: str) -> bool:
    """Postgres still names `owner` as the run's claim ('' claims nothing and is always
    answered yes)."""
    return not owner or _claimed_by(run_id) == owner


def _claimed_by(run_id: str) -> str | None:
    """The claim Postgres names for the run ('' for none; None: no such run)."""
    found = TaskHistory.objects.filter(id=run_id).values_list("owner_instance_id", flat=True)
    return found.first()


def cancel(
    definition: TaskDefinition,
    run_id: str,
    owner: str = "",
    *,
    error: dict[str, Any] | None = None,
) -> None:
    """cancelling → cancelled (`finish`); the run keeps its error unless one is given. A no-op
    if the run has already ended."""
    finish(End(run_id, definition.id, RunState.CANCELLED, owner, error=error))


def fail_unstarted(definition: TaskDefinition, run_id: str, kind: ErrorKind, message: str) -> None:
    """pending → failed for a run refused before it ever started (`finish`)."""
    finish(End(run_id, definition.id, RunState.FAILED, error=error_doc(kind, message)))
