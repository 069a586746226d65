"""Settling a run Postgres has ended: Valkey follows, then the `finished` hooks hear of it.

Every end of a run goes through `runs.terminal.finish`, which writes Postgres first and then
calls `settle`, the one place that brings the live hash to the Postgres state and runs the
end-of-run hooks; so does the repair of a live hash left behind (`recovery.repair`), for an
end Postgres already holds.

- The live hash follows by one Lua transition, fenced by the claim's owner where that owner
  is the caller (a process that lost the run cannot move it; an orphan's or a repaired run's
  owner is gone, so those are not fenced); a pending or active hash of a run Postgres
  cancelled goes cancelling → cancelled, fenced the same way.
- The move and the hooks' commands go in one pipeline: a run's end costs one Valkey round
  trip, and a task whose plan has no end hook sends the move alone. A hook the end's script
  may excuse (`RunHook.excused_at_end`: the circuit) hears of a completion only when the
  script says it must, in a second round trip; of any other end, with the move. Only a
  repair (which must know the move landed before the hooks run), a cancel the hash never
  heard of, or an outage take the slow path, the move alone and then the hooks.
- Valkey unreachable (a restart, a failover) is retried for about three seconds, then the
  hash is left for `recovery.repair`. A hash that disagrees (lost, moved on by someone else)
  cannot undo the Postgres write: it is logged, never raised.
- The hooks run once per end: the caller is the writer whose guarded Postgres UPDATE won, or,
  for a repair (`only_if_moved`), the process whose transition moved the hash.

The move's own script (`end_run.lua`) counts the end (/metrics, the day count of a task
without a cap) and publishes it to waiters, once: in the call that moves the hash, or that
finds it lost.

Not guaranteed: a completion's circuit record, when the end's script asks for it, is a call
of its own after the move: if Valkey fails just then, it is logged and not retried (a probe's
success then closes nothing, and its slot runs out for the next probe; a reset of the failure
count is lost). A writer whose Valkey stayed unreachable past the retries runs its hooks
anyway, and the repair that later moves the hash runs them again; so does a writer whose
pipeline was cut after Valkey ran it. Hooks are idempotent except a capped task's daily
completed/failed counts (Postgres), which can count that run twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from redis.client import Pipeline
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

from orchestrator.backoff import exponential
from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Outcome, Part
from orchestrator.states import IllegalTransition, RunState
from orchestrator.stores import live
from orchestrator.stores.live import FencedWrite
from tasks import registry
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

# 0.1 s doubling: about three seconds in all before the hash is left to the repair.
FOLLOW_ATTEMPTS = 6
FOLLOW_FIRST_PAUSE = timedelta(seconds=0.1)
FOLLOW_MAX_PAUSE = timedelta(seconds=2)


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
        return _follow(run_id, target, fence, live.EndCount(task_id), clock) is not None
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
        ended = _follow(run_id, target, fence, counted, clock)
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
    ended = _follow(run_id, target, fence, counted, clock)
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
                return  # the two steps, by `_follow`
            _disagreed(self.run_id, self.target, exc)
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


def _follow(
    run_id: str, target: RunState, owner: str, counted: live.EndCount, clock: Clock
) -> live.Ended | None:
    """The move alone, retried while Valkey is unreachable: what the script said, or None
    when the hash did not move."""
    for attempt in range(FOLLOW_ATTEMPTS):
        try:
            return _follow_once(run_id, target, owner, counted, clock)
        except (ValkeyConnectionError, ValkeyTimeoutError) as exc:
            if attempt == FOLLOW_ATTEMPTS - 1:
                log.error(
                    "run %s: %s in Postgres; live hash not updated, Valkey unreachable: %s",
                    run_id,
                    target,
                    exc,
                )
                return None
            pause = exponential(FOLLOW_FIRST_PAUSE, 2, attempt, FOLLOW_MAX_PAUSE)
            time.sleep(pause.total_seconds())
        except Exception:
            # Postgres has the end: a hash Valkey cannot read (a bug, a key of the wrong type)
            # must not keep the hooks from hearing of it; the repair looks at it again.
            log.exception("run %s: %s in Postgres; live hash not updated", run_id, target)
            return None
    return None


def _follow_once(
    run_id: str, target: RunState, owner: str, counted: live.EndCount, clock: Clock
) -> live.Ended | None:
    try:
        return live.end(run_id, target, counted, owner=owner, clock=clock)
    except FencedWrite as exc:
        log.warning("run %s: %s; live hash left to its owner", run_id, exc)
    except IllegalTransition as exc:
        if target == RunState.CANCELLED and exc.current in (RunState.PENDING, RunState.ACTIVE):
            return _cancel_in_two_steps(run_id, owner, counted, clock)
        _disagreed(run_id, target, exc)
    return None


def _disagreed(run_id: str, target: RunState, exc: IllegalTransition) -> None:
    if exc.current is None:
        log.info("run %s: no live hash to mark %s", run_id, target.value)
    else:
        log.warning("run %s: %s in Postgres, live hash disagreed: %s", run_id, target, exc)


def _cancel_in_two_steps(
    run_id: str, owner: str, counted: live.EndCount, clock: Clock
) -> live.Ended | None:
    """pending|active → cancelling → cancelled: the hash of a run Postgres cancelled, whose
    hash never heard of the cancel request (its signal failed, or the writer died)."""
    try:
        live.transition(run_id, RunState.CANCELLING, owner=owner, clock=clock)
        return live.end(run_id, RunState.CANCELLED, counted, owner=owner, clock=clock)
    except (FencedWrite, IllegalTransition) as exc:
        log.warning("run %s: cancelled in Postgres, live hash moved on: %s", run_id, exc)
        return None
