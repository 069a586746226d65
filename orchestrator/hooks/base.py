"""Lifecycle hooks: the documented points where cross-cutting concerns plug into a run.

Each concern (identity dedup, pause, circuit breaker, quotas, costs, concurrency, rate limit)
lives in its own module of this package as a `RunHook` subclass and overrides only the points
it needs. The composition root (`orchestrator.apps`)
installs them, in order, into `orchestrator.hooks.dispatch`; that order is the order they run in.

Whether a hook has anything to do for a task is said once, from the task's definition
(`applies`): the dispatcher compiles each task's plan, the hooks that apply and take part in
each point, and calls only those. A task that declares no identity, limit, rate or cost cap
runs none of that code, not even a call that returns None.

Points (one method each):
- `plan_admit` — inside `start_run`'s transaction, before the INSERT. Raise `Refused` to refuse
  (the transaction rolls back whatever admission wrote); raise `Deduplicated` to hand back a
  live run instead, or `Dropped` to have the start recorded as dropped. A hook that displaces
  waiting runs records them in `Admission.shed`; `start_run` cancels them on commit.
- `abandoned` — the admitted start did not happen after all (a later hook refused, the insert
  failed): undo what `admit` did outside the transaction (Valkey). A caller's transaction
  that rolls back later is not reported; hooks bound such leftovers with TTLs.
- `plan_before_claim` — in the runner, before the claim. Raise `Postpone` to put the message
  back for later without claiming; hooks that already passed get `release`. (A pause is the
  claim's own script's: `claim_run.lua`.)
- `release` — undo `before_claim` (a later hook postponed, or the claim was refused).
- `plan_before_stage` — a pipeline stage's message, before the stage's claim. Raise `Parked`
  to leave the stage waiting and its message acknowledged.
- `plan_heartbeat` — each Valkey heartbeat of a running run (or stage): renew what the run
  holds for as long as it runs (the concurrency lease).
- `plan_republished` — recovery publishes a live run's message again, or seeds its hash again,
  after Valkey may have lost what its start wrote (a delayed start released, the pending check,
  a resume): take it again (the identity).
- `plan_finished` — after a run's terminal write in both stores, whether or not it was claimed
  (cancelled before pickup, refused by the version guard); must be idempotent.

A `plan_*` point returns the hook's `Part`: the Valkey commands it sends and what it does with
their replies, or None when this one run gives it nothing to do (a run that is not the
circuit's probe). The parts of all hooks at one point go out
in one pipeline, so hooks that each need one call cost one round trip together. A part whose
commands must wait for the verdicts of the hooks before it says so (`after_replies`).
`abandoned` and `release`, rare paths, call Valkey directly. `run_alone` runs one hook's part
by itself (tests, a hook's own helpers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

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
    # What a hook asks to do once the start commits, after its INSERT (confirm what it took
    # provisionally): `start_run` registers them then, so none runs for a start that was
    # refused, dropped or deduplicated, or before the row exists.
    committed: list[Callable[[], None]] = field(default_factory=list)
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
    # The run's input when the runner has it before the claim (its first message carried it,
    # or its row was read); None: a hook that needs it reads the row.
    input: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class StagePickup:
    """A pipeline stage's message, before the stage is claimed."""

    definition: TaskDefinition
    run_id: str
    stage: str
    resource_class: str  # the stage's own class, else its task's


@dataclass(frozen=True)
class Beat:
    """One Valkey heartbeat of a running run (or of one of its stages)."""

    definition: TaskDefinition
    run_id: str
    owner: str  # the run's claim (a stage's run's): whose holdings the beat renews


@dataclass(frozen=True)
class Republished:
    """A live run that Valkey may have forgotten: its message published, or its hash seeded,
    again by recovery (or by the release of a delayed start)."""

    definition: TaskDefinition
    run_id: str
    identity: str


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


class Throttled(Deduplicated):
    """A throttled task's start within the period of the run it met (`hooks.throttle`): that
    run is answered, with when the next start of the identity may make a run."""

    def __init__(self, run_id: str, next_at: datetime) -> None:
        super().__init__(run_id)
        self.next_at = next_at


class Dropped(Exception):
    """Backpressure `drop`: start_run records the run as dropped and enqueues nothing."""

    code = "dropped"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Parked(Exception):
    """Held (a pause): the message is acknowledged unrun and the run stays pending (a stage:
    waiting) until whoever holds it publishes it again (the resume). `held_by` names what
    holds it."""

    def __init__(self, message: str, held_by: str) -> None:
        super().__init__(message)
        self.held_by = held_by


class Postpone(Exception):
    """Not now: put the message back and try again after `delay`."""

    def __init__(self, delay: timedelta, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


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
    send: Callable[[Pipeline], object] | None = None  # None: nothing to send
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
    if part.send is not None:
        part.send(pipe)
    part.receive(valkey.execute(pipe, raise_on_error=False) if len(pipe) else [])


@dataclass
class RunHook:
    """Base of the lifecycle hooks; every point is a no-op until overridden, and the dispatcher
    calls a hook only at the points it overrides, for the tasks it `applies` to."""

    name: str = field(default="hook")
    # Takes part at pickup only for a message carrying this note (`Admission.notes`): the
    # runs of a task whose messages carry none pay nothing for it there.
    pickup_note: ClassVar[str | None] = None
    # Judges a start only when the admission script says it must (`admit_run.lua`): it would
    # admit the start without a word otherwise (no pause refuses it, the circuit is closed).
    excused_at_admission: ClassVar[bool] = False
    # Hears of a run's end only when the end's own script says it must (`end_run.lua`,
    # `live.EndCount.ask_circuit`): recording the end would change nothing otherwise.
    excused_at_end: ClassVar[bool] = False

    def applies(self, definition: TaskDefinition) -> bool:
        """Whether the hook has anything to do for `definition`'s runs, at any point. Asked
        once per definition (and registry) when the dispatcher compiles the task's plan: it
        may read only the definition and the registry, never a store or the clock."""
        return True

    def takes_part(self, point: str, definition: TaskDefinition) -> bool:
        """Whether the hook takes part in `point` (a name of POINTS) for `definition`'s runs,
        of the points it overrides and for a task it `applies` to; the same rules hold."""
        return True

    def plan_admit(self, admission: Admission) -> Part | None:
        return None

    def abandoned(self, admission: Admission) -> None:
        return None

    def plan_before_claim(self, pickup: Pickup) -> Part | None:
        return None

    def release(self, pickup: Pickup) -> None:
        return None

    def plan_before_stage(self, stage: StagePickup) -> Part | None:
        return None

    def plan_heartbeat(self, beat: Beat) -> Part | None:
        return None

    def plan_republished(self, run: Republished) -> Part | None:
        return None

    def plan_finished(self, outcome: Outcome) -> Part | None:
        return None


# The points, by the name of the method a hook overrides to take part in them.
POINTS = (
    "plan_admit",
    "abandoned",
    "plan_before_claim",
    "release",
    "plan_before_stage",
    "plan_heartbeat",
    "plan_republished",
    "plan_finished",
)
