"""Per-task concurrency limit across every worker and host: a lease semaphore in Valkey.

A `RunHook`, in the chain of `orchestrator.apps.hook_chain` after the admission hooks and
before the rate limit, for the tasks that declare `quotas.max_concurrent` (`applies`); a task
that does not is bounded only by its pool's processes on each host
(`LUMASTRA_CONCURRENCY_<CLASS>`), as a Celery queue is by its workers, and its runs never call
this hook: no slot, no lease refresh. A pipeline run takes its slot with its first message and
keeps it until its end (refreshed by its stages' heartbeats; a lease that runs out between
stages frees the slot early).
At pickup (`before_claim`) one Lua script (`lua/concurrency_take.lua`) drops
expired leases and takes a slot, or records that the run must wait; the slot is given back
when the claim is refused or a later hook postpones (`release`), and after the terminal write
(`finished`). A holder that crashed holds its slot until its lease runs out.

Options:
- Why no default limit: one used to apply, the pool budget of one host minus one, and it was
  enforced cluster-wide. On 2 cores that held a cpu task to one run at a time on the whole
  cluster however many hosts it had (trickplay used half of one machine: bench/media.py);
  a default computed per host cannot be a cluster-wide number. A task that must leave
  processes of its pool to others, or that a remote service limits, declares its number.
- Lease: the task's hard timeout plus LEASE_MARGIN. The hard timeout is counted from the
  start of the Celery task, before the lease is taken, so a holder still running when its
  lease ends has been killed. Each heartbeat of a longer run renews its live lease
  (`plan_heartbeat`); a lease that has run out is never revived. Expiry uses Valkey's clock
  (TIME).
- A run that finds no slot raises `Postpone`: the runner re-publishes its message with that
  countdown and nothing blocks. The delay starts at BASE_DELAY and grows by GROWTH with each
  postponement of the run (counted in Valkey, so the count carries across workers and hosts)
  up to MAX_DELAY, or up to FRONT_MAX_DELAY for the runs at the front of the line (below),
  each with ±JITTER so that waiters do not return in step.

The place a waiting run keeps: the first time it finds no slot, it joins the task's waiting
line (`keys.concurrency_waiters`) at that moment, and keeps that position through every later
postponement until it takes a slot. The first `limit` runs of the line, the ones due for the
next slots, ask again at least every FRONT_MAX_DELAY; the runs behind them back off to
MAX_DELAY. So the oldest waiters come back most often and take most freed slots, and a newer
run is postponed into the line behind them. The runner re-publishes with the run's
priority, so the message keeps its priority too.

Not guaranteed:
- Strict order. A freed slot goes to whichever run asks first: a run newly taken from the
  queue, or a waiter further back, can beat the head of the line to it. Blocking them would
  leave freed slots idle until the head returns (up to FRONT_MAX_DELAY per hand-over), which
  would cut the throughput of short tasks to a few runs per second.
- A waiter that is not back within its longest delay plus STALE_GRACE (its message delayed
  behind busy workers, or its run cancelled) leaves the line; if it comes back later, it
  joins at the end.
- A crashed holder's slot stays taken until its lease ends (at most the hard timeout plus
  LEASE_MARGIN). A holder that outlives its lease (a worker frozen past it, with no heartbeat
  refreshing it) runs beside the run that took its slot.
- Every postponement is a new broker message; a deep backlog of one limited task turns into
  many delayed messages that come back every MAX_DELAY or so.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from orchestrator.backoff import exponential
from orchestrator.clock import span_ms
from orchestrator.hooks.base import Beat, Outcome, Part, Pickup, Postpone, RunHook, checked
from orchestrator.stores import keys, valkey
from tasks import registry
from tasks.definition import TaskDefinition

BASE_DELAY = timedelta(milliseconds=500)
GROWTH = 1.5
MAX_DELAY = timedelta(seconds=3)
FRONT_MAX_DELAY = timedelta(seconds=1)  # for the runs due for the next slots
JITTER = 0.2  # each delay is multiplied by a factor in [1 - JITTER, 1 + JITTER]
LEASE_MARGIN = timedelta(seconds=10)
# A waiter is expected back within MAX_DELAY (with jitter); the grace covers a delayed message
# waiting for a free worker process.
STALE_GRACE = timedelta(seconds=10)
STALE_AFTER = MAX_DELAY * (1 + JITTER) + STALE_GRACE


def limit_of(definition: TaskDefinition) -> int | None:
    """How many runs of the task may hold a slot at once, across the cluster; None: no limit
    but its pools' processes."""
    return definition.quotas.max_concurrent


def lease_of(definition: TaskDefinition) -> timedelta:
    return definition.timeout.hard + LEASE_MARGIN


def holder(run_id: str, owner: str) -> str:
    """The semaphore member of a run taken by one worker process.

    The owner is part of it so that a second delivery of the same run, picked up by another
    process at the same moment, takes and gives back its own slot, never the slot of the
    delivery that claimed the run.
    """
    return f"{run_id}|{owner}"


def backoff(
    postponements: int, rank: int, limit: int, rng: random.Random | None = None
) -> timedelta:
    """The delay before a postponed run asks again (see the module docstring).

    `rng` is for tests; by default the `random` module's generator, which Python reseeds in
    every forked worker process, so that processes forked from one parent do not share their
    jitter.
    """
    cap = FRONT_MAX_DELAY if rank < limit else MAX_DELAY
    delay = exponential(BASE_DELAY, GROWTH, postponements - 1, cap)
    return delay * (rng or random).uniform(1 - JITTER, 1 + JITTER)


def running(task_ids: Iterable[str]) -> dict[str, int]:
    """How many runs of each task hold a live slot now, in one Valkey round trip.

    Read-only: a lease that has run out is left for the next take to drop, and is not
    counted. Leases are judged by Valkey's clock, read in the same pipeline, as they are set.
    """
    ids = list(dict.fromkeys(task_ids))
    pipe = valkey.client().pipeline(transaction=False)
    pipe.time()
    for task_id in ids:
        pipe.zrange(keys.concurrency_holders(task_id), 0, -1, withscores=True)
    server_time, *held = valkey.execute(pipe)
    now_ms = valkey.time_ms(server_time)
    return {
        task_id: sum(1 for _, expiry_ms in holders if expiry_ms > now_ms)
        for task_id, holders in zip(ids, held, strict=True)
    }


def _give_back(task_id: str, run_id: str, owner: str) -> None:
    valkey.client().zrem(keys.concurrency_holders(task_id), holder(run_id, owner))


@dataclass
class ConcurrencyLimit(RunHook):
    name: str = "concurrency"

    def applies(self, definition: TaskDefinition) -> bool:
        return limit_of(definition) is not None

    def plan_before_claim(self, pickup: Pickup) -> Part | None:
        definition = pickup.definition
        limit = limit_of(definition)
        if limit is None:
            return None
        keys_ = [
            keys.concurrency_holders(definition.id),
            keys.concurrency_waiters(definition.id),
            keys.concurrency_postponed(definition.id),
        ]
        args: list[object] = [
            holder(pickup.run_id, pickup.owner),
            pickup.run_id,
            limit,
            span_ms(lease_of(definition)),
            span_ms(STALE_AFTER),
        ]

        def receive(replies: list[Any]) -> None:
            taken, postponements, rank = valkey.script_replied(
                "concurrency_take", keys_, args, replies[0]
            )
            if taken:
                return
            raise Postpone(
                backoff(postponements, rank, limit),
                f"task {definition.id!r} is running its limit of {limit} at once; "
                f"{rank} waiting ahead, postponed {postponements} time(s)",
            )

        return Part(
            receive, lambda pipe: valkey.queue_script(pipe, "concurrency_take", keys_, args)
        )

    def release(self, pickup: Pickup) -> None:
        if limit_of(pickup.definition) is not None:
            _give_back(pickup.definition.id, pickup.run_id, pickup.owner)

    def plan_heartbeat(self, beat: Beat) -> Part | None:
        """Renew the lease of the run's slot, if it holds a live one: a run that has ended,
        was never given one, or whose lease ran out (the slot may be another run's by now)
        renews nothing."""
        # The task's lease, as its pickup took it (a stage watched under its own timeout
        # renews its run's slot for the task's).
        definition = registry.get().get(beat.definition.id, beat.definition)
        if limit_of(definition) is None:
            return None
        key = [keys.concurrency_holders(definition.id)]
        args: list[object] = [holder(beat.run_id, beat.owner), span_ms(lease_of(definition))]

        def receive(replies: list[Any]) -> None:
            valkey.script_replied("concurrency_refresh", key, args, replies[0])

        return Part(
            receive, lambda pipe: valkey.queue_script(pipe, "concurrency_refresh", key, args)
        )

    def plan_finished(self, outcome: Outcome) -> Part | None:
        if limit_of(outcome.definition) is None:
            return None
        # Sent with the other hooks' end-of-run commands: a run that never took a slot (ended
        # before pickup) costs a ZREM of nothing in that same round trip.
        member = holder(outcome.run_id, outcome.owner)
        key = keys.concurrency_holders(outcome.definition.id)
        return Part(checked, lambda pipe: pipe.zrem(key, member))
