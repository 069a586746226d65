"""Named limits shared across tasks (issue 39): `define_limit` (`tasks.limits`), taken at pickup
by the tasks that name them (`limits=`) and inside handlers (`ctx.limit`).

One Lua script (`lua/limit_take.lua`) takes a taker's units of every limit it needs, all or
none, per key: a rate (a sliding window of admissions, as `hooks.ratelimit`'s, plus MARGIN) and
a concurrency (leases that run out with their holder: the task's hard timeout plus
LEASE_MARGIN, renewed by the run's heartbeats). Valkey's clock times both, so the budget is the
cluster's, whatever the hosts' clocks say.

At pickup (`before_claim`) a run takes one unit of each of its task's limits under its keys
(the limits' key functions of its input; the input the message carried, else its row's). A run
that finds one spent is postponed (`Postpone`: its message published again for when the rate
frees a place, or after a backoff for a concurrency), pending, its attempt not spent; it joins
the limit's waiting runs, which operators see (`GET /api/v1/limits`). The concurrency units are
given back when the run ends (`finished`), or when its claim is given back (`release`); a rate's
admission is kept for its window once the run was claimed.

What a pickup took is remembered by the pool process that took it (`_held`), which is the one
that ends the run: a run ended elsewhere (the reconciler's orphan check, the drain's replay)
gives its concurrency units back when their leases run out.

Only the limits that refused note the run as waiting. A key function that fails at pickup (its
code changed since the start checked it) counts the run under the limit's one key, "", and logs
it. A pipeline task takes limits inside its stages (`ctx.limit`), not with `limits=`.

Not guaranteed:
- Order among waiting runs (as `hooks.ratelimit`: the first back takes the place).
- A holder frozen past its lease runs beside the run that took its place; `ctx.limit`'s units
  are not renewed by heartbeats (a block longer than the task's hard timeout would be killed
  anyway).
- A claim given back (a retry, a put back) gives its rate admission back too, as
  `hooks.ratelimit` does, though the run may have called the API it guards.
- A handler's `ctx.limit` of a limit its task also takes at pickup needs a second unit: with
  `concurrency=1` it never gets one (it is put back until the pending deadline).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings

from orchestrator.clock import span_ms
from orchestrator.hooks.base import Beat, Outcome, Part, Pickup, Postpone, RunHook, checked
from orchestrator.models import TaskHistory
from orchestrator.stores import keys, valkey
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.limits import LimitDefinition

log = logging.getLogger(__name__)

MARGIN = timedelta(milliseconds=50)
LEASE_MARGIN = timedelta(seconds=10)
# A concurrency that refused: asked again after about this long.
FULL_BACKOFF = timedelta(seconds=1)
# A waiting run not back this long after it was due to ask again has left (cancelled, or taken
# another way); keys unused and waiting runs are forgotten after FORGET.
WAITING_GRACE = timedelta(seconds=60)
FORGET = timedelta(hours=1)


class Held(NamedTuple):
    """One limit, under one key, as a taker holds it."""

    limit: LimitDefinition
    key: str


class Take(NamedTuple):
    """What one call of the script answered."""

    wait: timedelta  # until the rates that refused could admit (zero: none refused)
    full: bool  # a concurrency refused
    refused: tuple[int, ...] = ()  # the positions of the limits that refused

    @property
    def taken(self) -> bool:
        return not self.full and not self.wait

    def delay(self) -> timedelta:
        """How long before asking again: the rates' wait, at least a jittered backoff for a
        full concurrency; never past half the broker's visibility timeout."""
        delay = self.wait
        if self.full:
            delay = max(delay, FULL_BACKOFF * random.uniform(0.8, 1.2))
        return min(delay, timedelta(seconds=settings.CONFIG.broker_visibility_timeout_s) / 2)


def lease_of(definition: TaskDefinition) -> timedelta:
    return definition.timeout.hard + LEASE_MARGIN


def _script_args(
    held: Sequence[Held], token: str, units: int, lease: timedelta, run_id: str
) -> tuple[list[str], list[object]]:
    script_keys: list[str] = []
    args: list[object] = [token, units, span_ms(lease), span_ms(MARGIN), run_id, span_ms(FORGET)]
    for limit, key in held:
        script_keys += keys.limit(limit.id, key)
        rate = limit.rate
        args += [
            rate.count if rate else 0,
            span_ms(rate.per) if rate else 0,
            limit.concurrency or 0,
            key,
        ]
    return script_keys, args


def _taken(reply: list[Any]) -> Take:
    wait_ms, full, *refused = reply
    positions = tuple(int(i) - 1 for i in refused)
    return Take(timedelta(milliseconds=int(wait_ms)), bool(int(full)), positions)


def take(held: Sequence[Held], token: str, units: int, lease: timedelta, run_id: str) -> Take:
    """Take `units` of every limit in `held` for `token`, all or none."""
    script_keys, args = _script_args(held, token, units, lease, run_id)
    return _taken(valkey.script("limit_take", script_keys, args))


def give_back(held: Sequence[Held], token: str, units: int, *, admissions: bool) -> None:
    """A taker's concurrency units given back (and, with `admissions`, its rate admissions:
    a taker that never ran), in one round trip."""
    pipe = valkey.client().pipeline(transaction=False)
    members = [f"{token}#{unit}" for unit in range(1, units + 1)]
    for limit, key in held:
        window, holders, *_ = keys.limit(limit.id, key)
        if limit.concurrency:
            pipe.zrem(holders, *members)
        if admissions and limit.rate:
            pipe.zrem(window, *members)
    if len(pipe):
        valkey.execute(pipe)


def keyed(definition: TaskDefinition, validated_input: object) -> list[Held]:
    """The task's limits under the keys of this input (ValueError: a key function failed)."""
    limits = registry.get().limits
    return [Held(limits[name], limits[name].key_of(validated_input)) for name in definition.limits]


def pickup_token(run_id: str, owner: str) -> str:
    return f"{run_id}|{owner}|pickup"


@dataclass
class NamedLimits(RunHook):
    name: str = "limits"
    # What each pickup of this process took, until its run ends or its claim is given back.
    _held: dict[tuple[str, str], list[Held]] = field(default_factory=dict)

    def applies(self, definition: TaskDefinition) -> bool:
        return bool(definition.limits)

    def plan_before_claim(self, pickup: Pickup) -> Part | None:
        definition = pickup.definition
        if not definition.limits:
            return None
        held = _held_at_pickup(pickup)
        if held is None:
            return None  # the run is gone: its claim refuses it
        token = pickup_token(pickup.run_id, pickup.owner)
        script_keys, args = _script_args(held, token, 1, lease_of(definition), pickup.run_id)

        def receive(replies: list[Any]) -> None:
            answer = _taken(valkey.script_replied("limit_take", script_keys, args, replies[0]))
            if not answer.taken:
                names = ", ".join(held[i].limit.id for i in answer.refused)
                raise Postpone(answer.delay(), f"waits for limit {names}")
            self._held[(pickup.run_id, pickup.owner)] = held

        # After the hooks before it answered: a run they postpone takes no unit.
        return Part(
            receive,
            lambda pipe: valkey.queue_script(pipe, "limit_take", script_keys, args),
            after_replies=True,
        )

    def release(self, pickup: Pickup) -> None:
        held = self._held.pop((pickup.run_id, pickup.owner), None)
        if held:
            give_back(held, pickup_token(pickup.run_id, pickup.owner), 1, admissions=True)

    def plan_heartbeat(self, beat: Beat) -> Part | None:
        held = self._held.get((beat.run_id, beat.owner))
        if not held:
            return None
        definition = registry.get().get(beat.definition.id, beat.definition)
        args = [pickup_token(beat.run_id, beat.owner) + "#1", span_ms(lease_of(definition))]
        renewed = [[keys.limit(limit.id, key)[1]] for limit, key in held if limit.concurrency]

        def send(pipe: Any) -> None:
            for holders in renewed:
                valkey.queue_script(pipe, "concurrency_refresh", holders, args)

        def receive(replies: list[Any]) -> None:
            for holders, reply in zip(renewed, replies, strict=True):
                valkey.script_replied("concurrency_refresh", holders, args, reply)

        return Part(receive, send) if renewed else None

    def plan_finished(self, outcome: Outcome) -> Part | None:
        held = self._held.pop((outcome.run_id, outcome.owner), None)
        if not held:
            return None
        member = pickup_token(outcome.run_id, outcome.owner) + "#1"
        holders = [keys.limit(limit.id, key)[1] for limit, key in held if limit.concurrency]

        def send(pipe: Any) -> None:
            for key in holders:
                pipe.zrem(key, member)

        return Part(checked, send) if holders else None


def _held_at_pickup(pickup: Pickup) -> list[Held] | None:
    """The task's limits under the keys of the run's input (the message's, else the row's);
    None when the row is gone. A key function that fails on it now (its code changed since the
    start checked it) counts the run under the limit's one key, "", and says so."""
    definition = pickup.definition
    data = pickup.input
    if data is None:
        rows = TaskHistory.objects.filter(id=pickup.run_id).values_list("input", flat=True)
        data = rows.first()
        if data is None:
            return None
    try:
        return keyed(definition, definition.input_model.model_validate(data))
    except ValueError:
        log.exception(
            "run %s: a limit's key failed on its input; counted under key ''", pickup.run_id
        )
        limits = registry.get().limits
        return [Held(limits[name], "") for name in definition.limits]


def waiting_for(definition: TaskDefinition, run_id: str) -> list[str]:
    """The limits a pending run of this task was last refused by, recently."""
    limits = registry.get().limits
    pipe = valkey.client().pipeline(transaction=False)
    pipe.time()
    for name in definition.limits:
        pipe.zrange(keys.limit(name, "")[3], 0, -1, withscores=True)
    now_ms, *found = valkey.execute(pipe)
    now = valkey.time_ms(now_ms)
    grace = span_ms(WAITING_GRACE)
    return [
        name
        for name, entries in zip(definition.limits, found, strict=True)
        if name in limits
        and any(m.endswith(f"\n{run_id}") and at + grace > now for m, at in entries)
    ]


@dataclass(frozen=True)
class KeyUse:
    """One key of a limit as operators see it (`GET /api/v1/limits`, the Limits page)."""

    key: str
    in_use: int  # concurrency units held under live leases
    waiting: int  # runs that found no room and are not overdue (WAITING_GRACE)
    rate_used: int | None = None  # admissions within the rate's window; None: no rate
    turn: str | None = None  # keyed concurrency: the run published for the key's turn


MOST_KEYS_SHOWN = 200


def usage(limit: LimitDefinition) -> list[KeyUse]:
    """Each key of `limit` used within FORGET (at most MOST_KEYS_SHOWN, most recent
    first): its units in use, its rate's admissions in the window, its waiting runs."""
    _, _, seen, waiting = keys.limit(limit.id, "")
    pipe = valkey.client().pipeline(transaction=False)
    pipe.time()
    pipe.zrevrange(seen, 0, MOST_KEYS_SHOWN - 1, withscores=True)
    pipe.zrange(waiting, 0, -1, withscores=True)
    server_time, recent, waiters = valkey.execute(pipe)
    now = valkey.time_ms(server_time)
    shown = [str(key) for key, used in recent if now - used < span_ms(FORGET)]
    waits: dict[str, int] = {}
    for member, at in waiters:
        if at + span_ms(WAITING_GRACE) > now:
            key = str(member).rsplit("\n", 1)[0]
            waits[key] = waits.get(key, 0) + 1
    pipe = valkey.client().pipeline(transaction=False)
    for key in shown:
        window, holders, *_ = keys.limit(limit.id, key)
        since = now - span_ms(limit.rate.per + MARGIN) if limit.rate else now
        pipe.zcount(window, f"({since}", "+inf")
        pipe.zcount(holders, f"({now}", "+inf")
    counts = valkey.execute(pipe)
    return [
        KeyUse(
            key,
            in_use=int(counts[2 * n + 1]),
            waiting=waits.get(key, 0),
            rate_used=int(counts[2 * n]) if limit.rate else None,
        )
        for n, key in enumerate(shown)
    ]
