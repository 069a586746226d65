"""Keyed concurrency with turns between keys (issue 39): `Concurrency(key=..., max=...)`.

`define_task(..., concurrency=Concurrency(key=lambda params: str(params.library_id), max=1))`
lets at most `max` runs of one key run at once across the cluster, and the keys take turns.
One Lua script (`lua/keyed.lua`) keeps, per task, the registered runs and, per key, its holders
(leases), its waiting runs (by priority, then age) and its one dispatched run (its turn):

- A start's run is not published on commit: it is registered with its key (`enqueue`, in the
  round trip that seeds its live hash), and published only when its key has room and no turn
  of its own. A key's
  turns put one message at a time in the broker, so a backlog of one key never holds back
  another's: queued A,A,A,B,B,B,C,C,C start A,B,C,A,B,C,... (within a key, priority, then age).
- At pickup (`before_claim`, after the other pickup hooks said yes: a run they postpone takes
  no place) the run takes a lease on one of its key's places, and the key's next waiting run is
  dispatched if a place remains. A run that finds its key full (its message published by a
  retry, a pause's release or the reconciler, not by its turn) waits: `Parked`, its message
  acknowledged unrun, pending, no attempt spent, dispatched when a place frees.
- A run's end (`finished`) frees every place it holds and dispatches the key's next run. A
  claim given back (`release`: a retry, a put back, a pause that parked it, a refused claim)
  frees its place and makes the run its key's turn again: the key's line waits for it to come
  back rather than pour into the broker meanwhile. A lease is the task's hard timeout plus
  LEASE_MARGIN, renewed by each heartbeat; a holder that died (SIGKILL, a lost host) frees its
  place when its put back releases it, or when its lease runs out.
- The leader's `turns` loop (`runs.due.release_turns`, every second) dispatches for the keys
  whose leases ran out or whose turn was not claimed within LUMASTRA_PENDING_CHECK_AFTER_S (its
  run ended meanwhile, or its message was lost: the reconciler's pending check, which looks in
  the broker, publishes such a run again), a slice of SWEEP_KEYS keys per pass, resuming where
  the last stopped.
- The reconciler's pending check leaves the runs Valkey tracks for their keys (waiting, a live
  turn, a live lease: `tracked`) and publishes any other pending run, which its pickup
  registers again.
- The runs are published by the composition root's `publish` (`runs.publish.publish_turns`).

The key is the task's function of the validated input (`tasks.policies.Concurrency.key_of`),
computed at start (a function that fails, or answers what is not a key, refuses the start: a 422
naming `concurrency.key`, `trigger_fields`) and recorded in the run's trigger
(`concurrencyKey`), where a pickup that finds the run unknown to Valkey (Valkey restarted
empty) reads it.

Not guaranteed:
- Strict turns when messages come another way: a retry's delayed message, a pause's release,
  the reconciler's publish, or two workers taking messages at once may start a key's run out of
  its turn; the limit per key still holds.
- A holder that outlives its lease (frozen past it, no heartbeat) runs beside the run that took
  its place; after Valkey lost these keys, the runs still running are not counted, so a key may
  run up to twice its `max` until they end.
- A keyed run's first message carries neither its admission's notes nor its row (it is read
  at pickup): a half-open circuit's probe that waits its turn does not renew its probe slot.
- A run waits at most LUMASTRA_PENDING_DEADLINE_S, as any pending run, before the reconciler
  fails it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from pydantic import BaseModel

from orchestrator.clock import span_ms
from orchestrator.hooks.base import Beat, Outcome, Parked, Part, Pickup, RunHook
from orchestrator.hooks.limits import KeyUse
from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from orchestrator.stores import broker, keys, live, valkey
from tasks import registry
from tasks.definition import TaskDefinition

# The run's trigger field that records its key.
KEY_FIELD = "concurrencyKey"
LEASE_MARGIN = timedelta(seconds=10)
# The most keys one sweep looks at; the next resumes after the last (`CURSOR`).
SWEEP_KEYS = 1000
# The field of the turns' hash that keeps where the sweep stopped (no key holds a newline).
CURSOR = "\n"


class Dispatched(NamedTuple):
    """A run whose turn came: to be published."""

    run_id: str
    job_id: str
    priority: int
    version: int


class Registered(NamedTuple):
    """A run to register with its key (`enqueue`)."""

    run_id: str
    key: str
    priority: int
    job_id: str
    version: int


Publish = Callable[[TaskDefinition, Sequence[Dispatched]], None]


class KeyFailed(ValueError):
    """A key function failed on a start's input; `loc` names the declaration."""

    def __init__(self, loc: list[str], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def trigger_fields(definition: TaskDefinition, validated_input: BaseModel) -> dict[str, str]:
    """What a start records of its keys (the concurrency key, `KEY_FIELD`), after checking
    every key function of the task on the input: its named limits' too, which a pickup
    computes again (`hooks.limits`). KeyFailed names the one that failed."""
    fields = {}
    if definition.concurrency is not None:
        try:
            fields[KEY_FIELD] = definition.concurrency.key_of(validated_input)
        except ValueError as exc:
            raise KeyFailed(["concurrency", "key"], str(exc)) from None
    for name in definition.limits:
        try:
            registry.get().limits[name].key_of(validated_input)
        except ValueError as exc:
            raise KeyFailed(["limits", name, "key"], str(exc)) from None
    return fields


def _fixed(definition: TaskDefinition) -> list[object]:
    """The script's arguments every verb takes: max, lease, and when a turn goes stale."""
    assert definition.concurrency is not None
    lease = definition.timeout.hard + LEASE_MARGIN
    stale = timedelta(seconds=settings.CONFIG.pending_check_after_s)
    return [definition.concurrency.max, span_ms(lease), span_ms(stale)]


def _call(definition: TaskDefinition, verb: str, *args: object) -> tuple[int, list[Dispatched]]:
    reply = valkey.script("keyed", keys.keyed(definition.id), [verb, *_fixed(definition), *args])
    return _read(reply)


def _read(reply: list[Any]) -> tuple[int, list[Dispatched]]:
    verdict, *flat = reply
    runs = [
        Dispatched(str(flat[i]), str(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]))
        for i in range(0, len(flat), 4)
    ]
    return int(verdict), runs


def enqueue(
    definition: TaskDefinition, runs: Iterable[Registered], *, seed: live.Seed | None = None
) -> list[Dispatched]:
    """Register runs with their keys, in one round trip (with `seed`: a new run's live hash
    seeded first in it, and counted as its start, `live.queue_seed`); the runs whose turn came
    now."""
    pipe = valkey.client().pipeline(transaction=False)
    read_seed = None if seed is None else live.queue_seed(pipe, seed, started=True)
    script_keys, fixed = keys.keyed(definition.id), _fixed(definition)
    calls = [
        ["enqueue", *fixed, run.run_id, run.key, run.priority, run.job_id, run.version]
        for run in runs
    ]
    for args in calls:
        valkey.queue_script(pipe, "keyed", script_keys, args)
    replies = valkey.execute(pipe, raise_on_error=False)
    if read_seed is not None:
        read_seed(replies.pop(0))
    dispatched: list[Dispatched] = []
    for args, reply in zip(calls, replies, strict=True):
        dispatched += _read(valkey.script_replied("keyed", script_keys, args, reply))[1]
    return dispatched


def sweep(definition: TaskDefinition) -> list[Dispatched]:
    """The runs whose turn came for leases that ran out or turns gone stale."""
    return _call(definition, "sweep", SWEEP_KEYS)[1]


def tracked(task_ids: Iterable[str]) -> set[str]:
    """The runs Valkey keeps moving for their keys: waiting, a turn not yet stale, a live lease.
    The reconciler does not publish them again; any other pending run it does."""
    ids = list(task_ids)
    pipe = valkey.client().pipeline(transaction=False)
    pipe.time()
    for task_id in ids:
        _, waiting, holders, _, queued = keys.keyed(task_id)
        pipe.zrange(waiting, 0, -1)
        pipe.zrange(holders, 0, -1, withscores=True)
        pipe.hgetall(queued)
    server_time, *replies = valkey.execute(pipe)
    now = valkey.time_ms(server_time)
    stale = span_ms(timedelta(seconds=settings.CONFIG.pending_check_after_s))
    found: set[str] = set()
    for waiting, holders, turns in zip(replies[::3], replies[1::3], replies[2::3], strict=True):
        found |= {str(member).rsplit("\n", 1)[1] for member in waiting}
        found |= {str(m).split("\n", 1)[1].split("|")[0] for m, until in holders if until > now}
        for key, turn in turns.items():
            run, _, since = str(turn).partition("\t")
            if str(key) != CURSOR and now - int(since) < stale:
                found.add(run)
    return found


def waiting_under(definition: TaskDefinition, run_id: str) -> str | None:
    """The key a pending run waits its turn under; None when it does not wait for one."""
    runs, waiting, *_ = keys.keyed(definition.id)
    entry = valkey.client().hget(runs, run_id)
    if entry is None:
        return None
    member = str(entry).split("\t")[1]
    if valkey.client().zscore(waiting, member) is None:
        return None
    return member.split("\n")[0]


@dataclass
class KeyedConcurrency(RunHook):
    name: str = "keyed"
    # Sends the runs whose turn came (the composition root gives `runs.turns.publish`).
    publish: Publish = field(default=lambda definition, runs: None)

    def applies(self, definition: TaskDefinition) -> bool:
        return definition.concurrency is not None

    def plan_before_claim(self, pickup: Pickup) -> Part | None:
        definition = pickup.definition
        if definition.concurrency is None:
            return None
        limit = definition.concurrency.max
        script_keys = keys.keyed(definition.id)
        args = ["take", *_fixed(definition), pickup.run_id, pickup.owner]

        def receive(replies: list[Any]) -> None:
            verdict, dispatched = _read(
                valkey.script_replied("keyed", script_keys, args, replies[0])
            )
            if verdict < 0:
                verdict, dispatched = self._take_unknown(pickup)
            self.publish(definition, dispatched)
            if verdict == 0:
                raise Parked(
                    f"run {pickup.run_id}: its key runs its limit of {limit}; it waits its turn",
                    "keyed",
                )

        # After the hooks before it answered (limits, rates): a run they postpone takes no place.
        return Part(
            receive,
            lambda pipe: valkey.queue_script(pipe, "keyed", script_keys, args),
            after_replies=True,
        )

    def _take_unknown(self, pickup: Pickup) -> tuple[int, list[Dispatched]]:
        """A run Valkey does not know (lost with a restart, or published before it was
        registered): registered from its row, then taken."""
        row = (
            TaskHistory.objects.filter(id=pickup.run_id, state=RunState.PENDING)
            .values_list("trigger", "priority", "identity", "processing_version")
            .first()
        )
        if row is None:
            return 1, []  # ended, or gone: the claim refuses it, and nothing is registered
        trigger, priority, identity, version = row
        key = str(trigger.get(KEY_FIELD, ""))
        job = broker.job_id(pickup.definition.id, identity, pickup.run_id)
        return _call(
            pickup.definition, "take", pickup.run_id, pickup.owner, key, priority, job, version
        )

    def release(self, pickup: Pickup) -> None:
        if pickup.definition.concurrency is not None:
            self.publish(
                pickup.definition,
                _call(pickup.definition, "release", pickup.run_id, pickup.owner)[1],
            )

    def plan_heartbeat(self, beat: Beat) -> Part | None:
        definition = registry.get().get(beat.definition.id, beat.definition)
        if definition.concurrency is None:
            return None
        script_keys = keys.keyed(definition.id)
        args = ["renew", *_fixed(definition), beat.run_id, beat.owner]

        def receive(replies: list[Any]) -> None:
            valkey.script_replied("keyed", script_keys, args, replies[0])

        return Part(receive, lambda pipe: valkey.queue_script(pipe, "keyed", script_keys, args))

    def plan_finished(self, outcome: Outcome) -> Part | None:
        definition = outcome.definition
        if definition.concurrency is None:
            return None
        script_keys = keys.keyed(definition.id)
        args = ["finish", *_fixed(definition), outcome.run_id, outcome.owner]

        def receive(replies: list[Any]) -> None:
            reply = valkey.script_replied("keyed", script_keys, args, replies[0])
            self.publish(definition, _read(reply)[1])

        return Part(receive, lambda pipe: valkey.queue_script(pipe, "keyed", script_keys, args))


def usage(definition: TaskDefinition) -> list[KeyUse]:
    """Each key with runs held, waiting or published for its turn: its places in use (live
    leases), its waiting runs and its turn."""
    _, waiting, holders, _, queued = keys.keyed(definition.id)
    pipe = valkey.client().pipeline(transaction=False)
    pipe.time()
    pipe.zrange(waiting, 0, -1)
    pipe.zrange(holders, 0, -1, withscores=True)
    pipe.hgetall(queued)
    server_time, waiters, held, turns = valkey.execute(pipe)
    now = valkey.time_ms(server_time)
    in_use: Counter[str] = Counter(
        str(member).split("\n", 1)[0] for member, until in held if until > now
    )
    waits: Counter[str] = Counter(str(member).split("\n", 1)[0] for member in waiters)
    turn_of = {str(k): str(v).partition("\t")[0] for k, v in turns.items() if str(k) != CURSOR}
    found = sorted(set(in_use) | set(waits) | set(turn_of))
    return [KeyUse(key, in_use[key], waits[key], turn=turn_of.get(key)) for key in found]
