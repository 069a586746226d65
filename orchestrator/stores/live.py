"""Live run state in Valkey: every change is one Lua script on the run hash."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple, TypedDict, cast

from django.conf import settings
from redis.client import Pipeline
from redis.exceptions import ResponseError

from orchestrator.clock import SYSTEM, Clock
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import counters, keys, valkey


class RunHash(TypedDict, total=False):
    state: str
    run_id: str
    task_id: str
    priority: str
    owner: str
    created_at: str  # ms since epoch
    updated_at: str
    started_at: str
    finished_at: str
    progress: str  # JSON {"done", "total", "item", "rate", "eta_s"} (`runs.progress`)


# A task's daily counts are kept this long: the quota rollup reads back as many days
# (`hooks.quotas.rollup`), so a loops process may stop for about a week without losing counts.
QUOTA_COUNT_TTL = timedelta(days=8)


class FencedWrite(Exception):
    """A write came from a process that no longer owns the run."""


class Held(Exception):
    """A claim refused because a pause holds the run (`claim_run.lua`): `field` names it (a
    field of `keys.pauses()`). The run stays pending in both stores, unclaimed."""

    def __init__(self, run_id: str, field: str) -> None:
        super().__init__(f"run {run_id}: held by the pause of {field.replace(':', ' ', 1)}")
        self.field = field


class Settling(IllegalTransition):
    """A claim refused while the run's hash, seeded again after Valkey lost it, settles
    (`reseed`); `left` is how long the mark still stands."""

    def __init__(self, run_id: str, left: timedelta) -> None:
        super().__init__(run_id, RunState.PENDING, RunState.ACTIVE, "valkey")
        self.args = (f"run {run_id}: claim refused for {left} while its re-seeded hash settles",)
        self.left = left


def _translate(exc: ResponseError, run_id: str, target: str) -> Exception:
    message = str(exc)
    if message.startswith("ILLEGAL_TRANSITION"):
        _, current, _ = message.split(" ", 2)
        return IllegalTransition(run_id, current, target, "valkey")
    if message == "NO_RUN":
        return IllegalTransition(run_id, None, target, "valkey")
    if message.startswith("SETTLING "):
        return Settling(run_id, timedelta(milliseconds=int(message.split(" ", 1)[1])))
    if message.startswith("PAUSED "):
        return Held(run_id, message[7:])
    if message.startswith("FENCED"):
        return FencedWrite(f"run {run_id}: write fenced, owned by {message[7:]!r}")
    return exc


def seed(
    run_id: str,
    task_id: str,
    priority: int,
    stages: tuple[str, ...],
    started: bool = False,
    clock: Clock = SYSTEM,
) -> bool:
    """The run's live hash, and its message counted as published (/metrics), in one call;
    `started`: the run counted as its start's outcome too (`start_run`'s own)."""
    script_keys, args = _seed_call(
        run_id, task_id, priority, stages, clock, published=True, started=started
    )
    return bool(valkey.script("seed_run", script_keys, args))


class Seed(NamedTuple):
    run_id: str
    task_id: str
    priority: int
    stages: tuple[str, ...]


def queue_seed(
    pipe: Pipeline, run: Seed, *, started: bool, clock: Clock = SYSTEM
) -> Callable[[Any], None]:
    """`seed` queued on `pipe` beside other commands (one round trip for all); the returned
    function reads its reply."""
    script_keys, args = _seed_call(*run, clock, published=True, started=started)
    valkey.queue_script(pipe, "seed_run", script_keys, args)
    return lambda reply: valkey.script_replied("seed_run", script_keys, args, reply)


def seed_many(runs: Sequence[Seed], clock: Clock = SYSTEM) -> None:
    """`seed` for many runs in one round trip (`start_runs`, the release of delayed starts)."""
    if not runs:
        return
    pipe = valkey.client().pipeline(transaction=False)
    calls = [_seed_call(*run, clock, published=True) for run in runs]
    for script_keys, args in calls:
        valkey.queue_script(pipe, "seed_run", script_keys, args)
    replies = valkey.execute(pipe, raise_on_error=False)
    for (script_keys, args), reply in zip(calls, replies, strict=False):
        valkey.script_replied("seed_run", script_keys, args, reply)


def _seed_call(
    run_id: str,
    task_id: str,
    priority: int,
    stages: tuple[str, ...],
    clock: Clock,
    *,
    published: bool,
    started: bool = False,
) -> tuple[list[str], list[Any]]:
    return (
        [
            keys.run_active(run_id),
            keys.metrics(counters.DELIVERY),
            keys.metrics(counters.START_OUTCOMES),
        ],
        [
            run_id,
            task_id,
            priority,
            valkey.to_ms(clock.now()),
            settings.CONFIG.run_active_ttl_s,
            int(published),
            int(started),
            *stages,
        ],
    )


def reseed_settle_s() -> int:
    """How long a hash seeded again after Valkey lost it stays marked (`reseed`): a heartbeat
    interval, by when a handler that held the lost claim has found it gone at its Valkey beat
    and claimed the run back (`runs.watch`), and a store timeout."""
    config = settings.CONFIG
    return config.heartbeat_interval_s + config.store_timeout_s


def reseed(
    run_id: str, task_id: str, priority: int, stages: tuple[str, ...], clock: Clock = SYSTEM
) -> bool:
    """Seed again the hash of a run Postgres calls pending whose hash Valkey lost, marked
    (`task:run:reseeded:<runId>`) for `reseed_settle_s()`: until then nobody claims it but a
    handler that held a claim Postgres had not heard of yet (a plain run's first second:
    `claim_again`), and the pending check does not publish it. False when the hash exists."""
    seeded = seed(run_id, task_id, priority, stages, clock=clock)
    if seeded:
        valkey.client().set(keys.run_reseeded(run_id), 1, ex=reseed_settle_s())
    return seeded


def admit(task_id: str, pauses: Pauses, count_day: bool, clock: Clock = SYSTEM) -> bool:
    """A start's admission check (`admit_run.lua`) alone: the start counted in the task's day
    when `count_day`; whether the hooks excused at admission (pause, circuit) must judge it."""
    script_keys, args = _admit_call(task_id, pauses, count_day, clock)
    return bool(valkey.script("admit_run", script_keys, args))


def queue_admission(
    pipe: Pipeline, task_id: str, pauses: Pauses, count_day: bool, clock: Clock = SYSTEM
) -> Callable[[Any], bool]:
    """`admit`, queued in `pipe` with the admission hooks' commands; returns what reads its
    reply."""
    script_keys, args = _admit_call(task_id, pauses, count_day, clock)
    valkey.queue_script(pipe, "admit_run", script_keys, args)
    return lambda reply: bool(valkey.script_replied("admit_run", script_keys, args, reply))


def _admit_call(
    task_id: str, pauses: Pauses, count_day: bool, clock: Clock
) -> tuple[list[str], list[Any]]:
    script_keys = [
        keys.pauses(),
        keys.circuit(task_id),
        keys.quota_counts(task_id, clock.now().date().isoformat()),
    ]
    return script_keys, [*pauses, int(count_day), int(QUOTA_COUNT_TTL.total_seconds())]


def give_back_start(task_id: str, clock: Clock = SYSTEM) -> None:
    """The start an admission check counted was refused (or joined another run): uncounted."""
    key = keys.quota_counts(task_id, clock.now().date().isoformat())
    pipe = valkey.client().pipeline(transaction=False)
    pipe.hincrby(key, "started", -1)
    pipe.expire(key, QUOTA_COUNT_TTL)
    valkey.execute(pipe)


def claim(run_id: str, owner: str, pauses: Pauses, clock: Clock = SYSTEM) -> None:
    """pending → active for `owner`, unless one of `pauses` holds the run (`Held`)."""
    script_keys, args = _claim_call(run_id, owner, pauses, clock)
    try:
        valkey.script("claim_run", script_keys, args)
    except ResponseError as exc:
        raise _translate(exc, run_id, RunState.ACTIVE) from None


def claim_again(
    run_id: str, task_id: str, priority: int, owner: str, clock: Clock = SYSTEM
) -> None:
    """A plain run's claim that Valkey lost while Postgres holds it for `owner`: its hash
    seeded again if it is gone, its reseed mark cleared (the mark waits for this very claim),
    then claimed (one round trip). Raises as `claim` does when someone else claimed it in
    Valkey meanwhile."""
    seed_keys, seed_args = _seed_call(run_id, task_id, priority, (), clock, published=False)
    pipe = valkey.client().pipeline(transaction=False)
    valkey.queue_script(pipe, "seed_run", seed_keys, seed_args)
    pipe.delete(keys.run_reseeded(run_id))
    read_claim = queue_claim(pipe, run_id, owner, NO_PAUSE, clock)
    seeded, _, claimed = valkey.execute(pipe, raise_on_error=False)
    valkey.script_replied("seed_run", seed_keys, seed_args, seeded)
    read_claim(claimed)


def queue_claim(
    pipe: Pipeline, run_id: str, owner: str, pauses: Pauses, clock: Clock = SYSTEM
) -> Callable[[Any], None]:
    """`claim`, queued in `pipe` to go with other commands (the pickup hooks'); returns what
    reads its reply (raising as `claim` would)."""
    script_keys, args = _claim_call(run_id, owner, pauses, clock)
    valkey.queue_script(pipe, "claim_run", script_keys, args)

    def read(reply: Any) -> None:
        try:
            valkey.script_replied("claim_run", script_keys, args, reply)
        except ResponseError as exc:
            raise _translate(exc, run_id, RunState.ACTIVE) from None

    return read


class Pauses(NamedTuple):
    """The fields of `keys.pauses()` that hold a run at its claim: its task's and its class's."""

    task: str
    resource_class: str

    @classmethod
    def of(cls, task_id: str, resource_class: str) -> Pauses:
        return cls(keys.pause_field("task", task_id), keys.pause_field("class", resource_class))


# The mirror's value for a scope whose run window is closed (`orchestrator.windows`).
WINDOW = "window"
# An operator's run ("run now", an operator's retry): a closed window lets it pass.
OPERATOR_PRIORITY = 1


def holds(mode: str | None, priority: int) -> bool:
    """Whether a field of the pauses' mirror saying `mode` holds a run of `priority`: a pause
    holds every run, a closed window every run but an operator's (claim_run.lua's own rule)."""
    return bool(mode) and (mode != WINDOW or priority != OPERATOR_PRIORITY)


def holding(run_id: str, pauses: Pauses, priority: int) -> Held | None:
    """What a claim of the run (at `priority`) would be refused for now: the pause or closed
    window among `pauses` that holds it, if any."""
    found = cast(list[str | None], valkey.client().hmget(keys.pauses(), list(pauses)))
    field = next((f for f, mode in zip(pauses, found, strict=True) if holds(mode, priority)), None)
    return None if field is None else Held(run_id, field)


# A claim no pause holds: a running run's, taken back (`claim_again`): running runs finish.
NO_PAUSE = Pauses("", "")


def _claim_call(
    run_id: str, owner: str, pauses: Pauses, clock: Clock
) -> tuple[list[str], list[Any]]:
    return (
        [
            keys.run_active(run_id),
            keys.run_terminal(run_id),
            keys.run_reseeded(run_id),
            keys.pauses(),
        ],
        [owner, valkey.to_ms(clock.now()), settings.CONFIG.run_active_ttl_s, *pauses],
    )


def transition(
    run_id: str, target: RunState, *, owner: str = "", clock: Clock = SYSTEM
) -> RunState:
    """Move the live hash to `target`, not an end (`end` is every end; `claim` the worker's
    pending → active); `owner` fences writes from a process that lost the run."""
    script_keys = [keys.run_active(run_id), keys.run_terminal(run_id)]
    args = [target.value, valkey.to_ms(clock.now()), settings.CONFIG.run_active_ttl_s, owner]
    try:
        return RunState(valkey.script("transition_run", script_keys, args))
    except ResponseError as exc:
        raise _translate(exc, run_id, target) from None


class EndCount(NamedTuple):
    """What a run's end counts besides /metrics (`end_run.lua`): its task, whether the end
    counts in the task's day (an uncapped task's completed or failed; a capped task counts in
    Postgres), and whether to ask if the task's circuit must hear of the end."""

    task_id: str
    count_day: bool = False
    ask_circuit: bool = False


class Ended(NamedTuple):
    """What a run's end in Valkey found: the hash's state before it, and whether the task's
    circuit must record the end (only when asked: `EndCount.ask_circuit`)."""

    previous: RunState
    circuit: bool


def _end_call(
    run_id: str, target: RunState, owner: str, counted: EndCount, clock: Clock
) -> tuple[list[str], list[Any]]:
    now = clock.now()
    return (
        [
            keys.run_active(run_id),
            keys.run_terminal(run_id),
            keys.metrics(counters.RUNS),
            keys.metrics(counters.DURATION),
            keys.quota_counts(counted.task_id, now.date().isoformat()),
            keys.circuit(counted.task_id),
        ],
        [
            target.value,
            valkey.to_ms(now),
            settings.CONFIG.run_terminal_ttl_s,
            owner,
            counted.task_id,
            int(counted.count_day),
            int(QUOTA_COUNT_TTL.total_seconds()),
            keys.run_ended(run_id),
            int(counted.ask_circuit),
            *counters.DURATION_BUCKETS,
        ],
    )


def end(
    run_id: str, target: RunState, counted: EndCount, *, owner: str = "", clock: Clock = SYSTEM
) -> Ended:
    """The run's end in Valkey (Postgres holds it): the hash moves to its terminal snapshot,
    counted and announced in the same call (`end_run.lua`); `owner` fences as `transition`."""
    script_keys, args = _end_call(run_id, target, owner, counted, clock)
    try:
        previous, circuit = valkey.script("end_run", script_keys, args)
    except ResponseError as exc:
        raise _translate(exc, run_id, target) from None
    return Ended(RunState(previous), bool(circuit))


def queue_end(
    pipe: Pipeline,
    run_id: str,
    target: RunState,
    counted: EndCount,
    *,
    owner: str = "",
    clock: Clock = SYSTEM,
) -> Callable[[Any], Ended]:
    """`end`, queued in `pipe` to go with other commands; returns what reads its reply
    (raising as `end` would)."""
    script_keys, args = _end_call(run_id, target, owner, counted, clock)
    valkey.queue_script(pipe, "end_run", script_keys, args)

    def read(reply: Any) -> Ended:
        try:
            previous, circuit = valkey.script_replied("end_run", script_keys, args, reply)
        except ResponseError as exc:
            raise _translate(exc, run_id, target) from None
        return Ended(RunState(previous), bool(circuit))

    return read


def transition_stage(
    run_id: str, stage: str, target: StageState, clock: Clock = SYSTEM
) -> StageState:
    # The terminal snapshot too: a stage Postgres moved before the run's end, followed after
    # another process settled that end, still reads as Postgres has it.
    script_keys = [keys.run_active(run_id), keys.run_terminal(run_id)]
    args = [stage, target.value, valkey.to_ms(clock.now())]
    # Postgres made the move already: followers of /events hear of it in the same round trip.
    event = {"type": "stage", "run_id": run_id, "stage": stage, "state": target.value}
    try:
        previous = valkey.script_with(
            "transition_stage", script_keys, args, lambda pipe: queue_event(pipe, event)
        )
    except ResponseError as exc:
        if str(exc).startswith("NO_STAGE"):
            raise IllegalTransition(run_id, None, f"{stage}:{target}", "valkey") from None
        raise _translate(exc, run_id, f"{stage}:{target.value}") from None
    return StageState(previous)


def queue_event(pipe: Pipeline, event: dict[str, Any]) -> None:
    """A run's live event (progress, a stage move) for the followers of `GET /events`."""
    pipe.publish(keys.run_events(), json.dumps(event))


def progress_of(run_ids: list[str]) -> list[str | None]:
    """The live `progress` field of each run (None where it has none), one round trip."""
    pipe = valkey.client().pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(keys.run_active(run_id), "progress")
    return valkey.execute(pipe)


def read(run_id: str) -> RunHash:
    """The live hash, or the terminal snapshot once the run has ended; {} if neither exists."""
    client = valkey.client()
    found = client.hgetall(keys.run_active(run_id)) or client.hgetall(keys.run_terminal(run_id))
    return cast(RunHash, found)


def count_delivery(run_id: str) -> int:
    """One more delivery of the run's message (and one more redelivery in /metrics, in the
    same round trip); 0 when the run has no live hash."""
    deliveries = valkey.script_with(
        "count_delivery",
        [keys.run_active(run_id)],
        ["delivery"],
        lambda pipe: counters.add(counters.DELIVERY, ("redelivered",), 1, pipe),
    )
    return int(deliveries)
