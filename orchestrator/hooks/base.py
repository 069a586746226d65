"""Lifecycle hooks: the documented points where cross-cutting concerns plug into a run.

Each concern (identity dedup, circuit breaker, quotas, backpressure, concurrency, rate limit)
lives in its own module of this package as a `RunHook` subclass and overrides only the points
it needs. The composition root (`orchestrator.apps`) installs them, in order, into
`orchestrator.hooks.dispatch`; that order is the order they run in.

Points:
- `admit` — inside `start_run`'s transaction, before the INSERT. Raise `Refused` to refuse
  (the transaction rolls back whatever admission wrote); raise `Deduplicated` to hand back a
  live run instead, or `Dropped` to have the start recorded as dropped. A hook that displaces
  waiting runs records them in `Admission.shed`; `start_run` cancels them on commit.
- `abandoned` — the admitted start did not happen after all (a later hook refused, the insert
  failed): undo what `admit` did outside the transaction (Valkey). A caller's transaction
  that rolls back later is not reported; hooks bound such leftovers with TTLs.
- `before_claim` — in the runner, before the claim. Raise `Postpone` to put the message
  back for later without claiming; hooks that already passed get `release`.
- `release` — undo `before_claim` (a later hook postponed, or the claim was refused).
- `finished` — after a run's terminal write in both stores, whether or not it was claimed
  (cancelled before pickup, refused by the version guard); must be idempotent.

Planned points: at `admit`, `before_claim` and `finished` the dispatcher asks each hook for
its `Part` (`plan_admit`, `plan_before_claim`, `plan_finished`): the Valkey commands it sends
and what it does with their replies. The parts of all hooks at one point go out in one
pipeline, so hooks that each need one call cost one round trip together, and a hook with
nothing to do (no limit configured) plans nothing. A part whose commands must wait for the
verdicts of the hooks before it says so (`after_replies`). `admit`, `before_claim` and
`finished` run the hook's own part alone (direct calls, tests); a hook that overrides one of
those instead of its plan is called at its turn, as before. `abandoned` and `release`, rare
paths, call Valkey directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from redis.client import Pipeline

from orchestrator.states import RunState
from orchestrator.stores import valkey
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind


@dataclass(frozen=True)
class Shed:
    """Waiting runs a hook took out of the broker to make room; the caller cancels them."""

    run_ids: list[str]
    reason: str


@dataclass(frozen=True)
class Admission:
    definition: TaskDefinition
    run_id: str
    identity: str
    priority: int
    trigger: dict[str, Any]
    # Filled by hooks that displace other runs: a hook decides, `start_run` acts (cancels
    # them once its transaction commits), so no hook reaches into the run path.
    shed: list[Shed] = field(default_factory=list)
    # What a hook needs to hear again at pickup (e.g. "this run is the circuit's probe"): the
    # run's first message carries it (`runs.publish.HOOK_HEADER`) and the pickup hands it back
    # (`Pickup.notes`), so a hook asks Valkey at pickup only for the runs it marked.
    notes: dict[str, bool] = field(default_factory=dict)
    # A delayed start's time (`runs.due`): it joins no queue until then, so nothing judges it
    # by the queue today, it is never the circuit's probe (its message carries no note), and
    # its identity is held until then and for LUMASTRA_IDENTITY_TTL_S after.
    not_before: datetime | None = None


@dataclass(frozen=True)
class Pickup:
    definition: TaskDefinition
    run_id: str
    owner: str
    # The admission's `notes`, as the message carried them; empty for a message published
    # again (a retry, a put back, the reconciler's), which carries none.
    notes: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    definition: TaskDefinition
    run_id: str
    owner: str
    state: RunState
    error_kind: ErrorKind | None = None
    # Attempts of one run count once toward failure-based decisions (the circuit).
    final: bool = True


class Refused(Exception):
    """Admission said no. `code` is stable for API clients; the message is for people."""

    code = "refused"
    http_status = 409

    def __init__(self, message: str, *, retry_after: timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Deduplicated(Exception):
    """A live run already does this work; start_run returns it instead of a new one."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class Dropped(Exception):
    """Backpressure `drop`: start_run records the run as dropped and enqueues nothing."""

    code = "dropped"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Postpone(Exception):
    """Not now: put the message back and try again after `delay`."""

    def __init__(self, delay: timedelta, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


def _nothing_to_send(pipe: Pipeline) -> None:
    return None


@dataclass(frozen=True)
class Part:
    """One hook's part of a point, sent in one pipeline with the other hooks' parts.

    `send` adds the hook's commands to the coordination Valkey pipeline and reads nothing;
    `receive` gets the replies of exactly those commands (errors as values) and decides: it
    may raise the point's exceptions (`Refused`, `Postpone`, ...), read Postgres or the
    broker. `after_replies`: the commands depend on the verdicts of the hooks before it (the
    rate limit must take nothing for a run the concurrency limit postpones), so the earlier
    parts are sent and received first.
    """

    receive: Callable[[list[Any]], object]
    send: Callable[[Pipeline], object] = _nothing_to_send
    after_replies: bool = False


def checked(replies: list[Any]) -> list[Any]:
    """A part's replies, raising the first error among them (sent as a value)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def run_alone(part: Part | None) -> None:
    """One hook's part on its own: its commands (if any) in one round trip, then its verdict."""
    if part is None:
        return
    pipe = valkey.client().pipeline(transaction=False)
    part.send(pipe)
    part.receive(valkey.execute(pipe, raise_on_error=False) if len(pipe) else [])


@dataclass
class RunHook:
    """Base of the lifecycle hooks; every point is a no-op until overridden.

    The dispatcher calls `plan_admit`, `plan_before_claim` and `plan_finished`, `abandoned`
    and `release`. A hook overrides either a point's plan (to share the round trip) or the
    point itself (`admit`, ...), which is then called in its turn, after the replies of the
    hooks before it.
    """

    name: str = field(default="hook")

    def plan_admit(self, admission: Admission) -> Part | None:
        if type(self).admit is RunHook.admit:
            return None
        return Part(lambda replies: self.admit(admission), after_replies=True)

    def plan_before_claim(self, pickup: Pickup) -> Part | None:
        if type(self).before_claim is RunHook.before_claim:
            return None
        return Part(lambda replies: self.before_claim(pickup), after_replies=True)

    def plan_finished(self, outcome: Outcome) -> Part | None:
        if type(self).finished is RunHook.finished:
            return None
        return Part(lambda replies: self.finished(outcome))

    def admit(self, admission: Admission) -> None:
        run_alone(self.plan_admit(admission))

    def abandoned(self, admission: Admission) -> None:
        return None

    def before_claim(self, pickup: Pickup) -> None:
        run_alone(self.plan_before_claim(pickup))

    def release(self, pickup: Pickup) -> None:
        return None

    def finished(self, outcome: Outcome) -> None:
        run_alone(self.plan_finished(outcome))
