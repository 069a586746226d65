"""Keyed concurrency with turns between keys (issue 39): `Concurrency(key=..., max=...)`.

`define_task(..., concurrency=Concurrency(key=lambda params: str(params.library_id), max=1))`
lets at most `max` runs of one key run at once across the cluster, and the keys take turns.
One Lua script (`lua/keyed.lua`) keeps, per task, the registered runs and, per key, its holders
(leases), its waiting runs (by priority, then age) and its one dispatched run:

- A start's run is not published on commit: it is registered with its key (`enqueue`, from
  `runs.turns`), and published only when its key has room and no dispatched run of its own.
  Every key then has at most one message in the broker, so a backlog of one key never holds
  back another's: queued A,A,A,B,B,B,C,C,C start A,B,C,A,B,C,... (within a key, priority,
  then age).
- At pickup (`before_claim`) the run takes a lease on one of its key's places, and the key's
  next waiting run is dispatched if a place remains. A run that finds its key full (its message
  published by a retry, a redelivery or the reconciler, not by its turn) waits: `Parked`, its
  message acknowledged unrun, pending, no attempt spent, dispatched when a place frees.
- A run's end (`finished`), a claim given back (`release`: a put back, a retry, a refused
  claim) frees its place and dispatches the key's next run. A lease is the task's hard timeout
  plus LEASE_MARGIN, renewed by each heartbeat; a holder that died (SIGKILL, a lost host) frees
  its place when its put back releases it, or when its lease runs out.
- The leader's `keyed` loop (`runs.turns.sweep`, every second) dispatches for the keys whose
  leases ran out or whose dispatched run's message was not claimed within TURN_STALE (lost).
- The runs are published by the composition root's `publish` (`runs.turns.publish`): this
  layer does not send messages.

The key is the task's function of the validated input (`TaskDefinition.concurrency_key`),
computed at start (a function that fails, or answers what is not a key, refuses the start: a 422
naming `concurrency.key`) and recorded in the run's trigger (`concurrencyKey`), where a pickup
that finds the run unknown to Valkey (Valkey restarted empty) reads it.

Not guaranteed:
- Strict turns when messages come back out of order: a retry's delayed message, or two workers
  taking messages at once, may start a key's run out of its turn; the limit per key still holds.
- A holder that outlives its lease (frozen past it, no heartbeat) runs beside the run that took
  its place.
- A run waits at most LUMASTRA_PENDING_DEADLINE_S, as any pending run, before the reconciler
  fails it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings

from orchestrator.clock import span_ms
from orchestrator.hooks.base import Beat, Outcome, Parked, Part, Pickup, RunHook
from orchestrator.models import TaskHistory
from orchestrator.stores import broker, keys, valkey
from tasks import registry
from tasks.definition import TaskDefinition

# The run's trigger field that records its key.
KEY_FIELD = "concurrencyKey"
LEASE_MARGIN = timedelta(seconds=10)
# The most keys one sweep looks at.
SWEEP_KEYS = 1000


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


def enqueue(definition: TaskDefinition, runs: Iterable[Registered]) -> list[Dispatched]:
    """Register runs with their keys, in one round trip; the runs whose turn came now."""
    pipe = valkey.client().pipeline(transaction=False)
    script_keys, fixed = keys.keyed(definition.id), _fixed(definition)
    calls = [
        ["enqueue", *fixed, run.run_id, run.key, run.priority, run.job_id, run.version]
        for run in runs
    ]
    for args in calls:
        valkey.queue_script(pipe, "keyed", script_keys, args)
    dispatched: list[Dispatched] = []
    for args, reply in zip(calls, valkey.execute(pipe, raise_on_error=False), strict=True):
        dispatched += _read(valkey.script_replied("keyed", script_keys, args, reply))[1]
    return dispatched


def sweep(definition: TaskDefinition) -> list[Dispatched]:
    """The runs whose turn came for leases that ran out or turns gone stale."""
    return _call(definition, "sweep", SWEEP_KEYS)[1]


def registered(task_ids: Iterable[str]) -> set[str]:
    """The runs Valkey knows for their keys (waiting, dispatched or holding): the reconciler
    does not publish them again."""
    pipe = valkey.client().pipeline(transaction=False)
    for task_id in task_ids:
        pipe.hkeys(keys.keyed(task_id)[0])
    return {str(run_id) for ids in valkey.execute(pipe) for run_id in ids}


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

        return Part(receive, lambda pipe: valkey.queue_script(pipe, "keyed", script_keys, args))

    def _take_unknown(self, pickup: Pickup) -> tuple[int, list[Dispatched]]:
        """A run Valkey does not know (lost with a restart, or published before it was
        registered): registered from its row, then taken."""
        row = (
            TaskHistory.objects.filter(id=pickup.run_id)
            .values_list("trigger", "priority", "identity", "processing_version")
            .first()
        )
        if row is None:
            return 1, []  # the claim finds nothing to run
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
