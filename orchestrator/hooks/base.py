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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from orchestrator.states import RunState
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


@dataclass(frozen=True)
class Pickup:
    definition: TaskDefinition
    run_id: str
    owner: str


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


@dataclass
class RunHook:
    """Base of the lifecycle hooks; every point is a no-op until overridden."""

    name: str = field(default="hook")

    def admit(self, admission: Admission) -> None:
        return None

    def abandoned(self, admission: Admission) -> None:
        return None

    def before_claim(self, pickup: Pickup) -> None:
        return None

    def release(self, pickup: Pickup) -> None:
        return None

    def finished(self, outcome: Outcome) -> None:
        return None
