"""Pause (issue 27): a paused task or resource class starts nothing new, cluster-wide.

A `RunHook`, in the chain of `orchestrator.apps.hook_chain` right after identity dedup. The
pauses' Valkey mirror (`keys.pauses()`, the task's field and its class's) is read by the
start's admission script and the claim's own script, so a run pays no round trip for it,
paused or not, and this hook runs only for a start a pause refuses.

- Admission: a pause that refuses starts answers 503 `paused` (`Paused`), and nothing is
  written; any other pause takes the start: the run is recorded `pending` and published.
- Pickup: the claim's own script reads the mirror (`claim_run.lua`, `live.Held`), so no hook
  runs there: a paused run is parked, its message acknowledged without running it and
  nothing claimed. The run stays `pending` in both stores, with no message, so no worker
  spins on it; `recovery.pauses.resume` publishes the parked runs again, most urgent first.
- A stage of a pipeline (`plan_before_stage`, heard by its message before its claim) is held
  (`Parked`) when its run's task or the stage's own class is paused: the stage stays `waiting`
  and its message is acknowledged; the resume publishes it again. A stage claim reads nothing
  from Valkey before it, so a stage reads the mirror through a copy each process keeps for
  STAGE_FRESH_S: at most one HGETALL per process and second, not one per stage.
- A run or stage already claimed is not touched: running runs finish.

The mirror is written by `recovery.pauses` after the `task_pause` row commits (Postgres is
the truth) and rebuilt from it, with the closed run windows, by the leader's windows loop every
second (`rebuild`, `recovery.windows`), so a Valkey that lost it holds runs again within a
second while a leader runs.

Not guaranteed:
- A pickup that read the mirror just before a resume parks its run after the resume looked
  for parked runs; the resume publishes every pending run of the scope not waiting in a queue,
  so it finds that one too (published twice at worst: only one delivery can claim a run).
- While Valkey has lost the mirror (a restart without persistence) and the windows loop has
  not rebuilt it, paused runs run.
- A stage taken within STAGE_FRESH_S of a pause may still run. A resume waits that long
  before it publishes held stages, so none is parked after it looked for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, cast

import redis
from redis.client import Pipeline

from orchestrator.hooks.base import (
    Admission,
    Parked,
    Part,
    Refused,
    RunHook,
    StagePickup,
    checked,
)
from orchestrator.stores import keys, live, valkey
from tasks.definition import TaskDefinition

HOLD = "hold"  # runs wait, starts are taken
REFUSE = "refuse"  # runs wait, starts are refused
# How old a process's copy of the mirror may be when a stage reads it.
STAGE_FRESH_S = 1.0


class Paused(Refused):
    """A start of a task paused with "pause and refuse", or of a task of such a class."""

    code = "paused"
    http_status = 503


def parked(run_id: str, field: str) -> Parked:
    """A stage at its pickup: its run's task or its class is paused (the mirror's `field`);
    its message is acknowledged unrun and it waits until a resume publishes it again. Said as
    a run's claim says it (`live.Held`)."""
    return Parked(str(live.Held(run_id, field)), field)


def fields_for(task_id: str, resource_class: str) -> tuple[str, str]:
    """The mirror's fields that hold a task's work in a class: the task's pause, the class's
    (a run's own class, or a pipeline stage's)."""
    return live.Pauses.of(task_id, resource_class)


def fields_of(definition: TaskDefinition) -> tuple[str, str]:
    """The mirror's fields that pause `definition`'s runs: its own and its class's."""
    return fields_for(definition.id, definition.resource_class)


def _pause_of(fields: tuple[str, str], replies: list[Any]) -> tuple[str, str] | None:
    """(field, mode) of the pause in force among `fields`, a refusing one first; None: none."""
    values = checked(replies)[0]
    found = [(f, str(v)) for f, v in zip(fields, values, strict=True) if v is not None]
    found.sort(key=lambda pair: pair[1] != REFUSE)
    return found[0] if found else None


class PauseGate(RunHook):
    # A start is judged here only when the admission script found a pause that refuses it.
    excused_at_admission: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__(name="pause")

    def plan_admit(self, admission: Admission) -> Part:
        def judge(pause: tuple[str, str]) -> None:
            if pause[1] == REFUSE:
                scope, _, name = pause[0].partition(":")
                raise Paused(f"{scope} {name!r} is paused and refuses new starts; resume it first")

        return _read(fields_of(admission.definition), judge)

    def plan_before_stage(self, stage: StagePickup) -> Part:
        """From this process's copy of the mirror: nothing is sent."""

        def judge(replies: list[Any]) -> None:
            paused = _copy.current()
            for field in fields_for(stage.definition.id, stage.resource_class):
                if field in paused:
                    raise parked(stage.run_id, field)

        return Part(judge)


def _read(fields: tuple[str, str], judge: Callable[[tuple[str, str]], None]) -> Part:
    """One HMGET of `fields` in the point's pipeline; `judge` hears of a pause in force."""

    def receive(replies: list[Any]) -> None:
        pause = _pause_of(fields, replies)
        if pause is not None:
            judge(pause)

    return Part(receive, lambda pipe: pipe.hmget(keys.pauses(), list(fields)))


def mirror(field: str, mode: str | None, pipe: Pipeline | None = None) -> None:
    """Set (`mode`: HOLD or REFUSE) or clear (None) one pause in the mirror."""
    target = pipe if pipe is not None else valkey.client()
    if mode is None:
        target.hdel(keys.pauses(), field)
    else:
        target.hset(keys.pauses(), field, mode)


def in_mirror() -> dict[str, str]:
    return cast(dict[str, str], valkey.client().hgetall(keys.pauses()))


def rebuild(
    read_truth: Callable[[], Mapping[str, str]],
    on_change: Callable[[Pipeline, Mapping[str, str]], None] | None = None,
) -> dict[str, str] | None:
    """Make the mirror say what `read_truth()` (field → mode, from Postgres) says; returns what
    it said before when it had to change, else None. Valkey is watched before Postgres is read,
    so a pause or resume written meanwhile (Postgres, then the mirror) makes this pass give way
    rather than undo it. `on_change(pipe, before)` adds its own writes to the same MULTI."""
    with valkey.client().pipeline(transaction=True) as pipe:
        try:
            pipe.watch(keys.pauses())  # type: ignore[no-untyped-call]
            current = cast(dict[str, str], pipe.hgetall(keys.pauses()))
            truth = dict(read_truth())
            if truth == current:
                return None
            pipe.multi()
            pipe.delete(keys.pauses())
            if truth:
                pipe.hset(keys.pauses(), mapping=truth)
            if on_change is not None:
                on_change(pipe, current)
            valkey.execute(pipe)
        except redis.WatchError:
            return None
    return current


class _Copy:
    """This process's copy of the mirror, for stage pickups."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.read_at = float("-inf")

    def current(self) -> dict[str, str]:
        if time.monotonic() - self.read_at >= STAGE_FRESH_S:
            self.fields = in_mirror()
            self.read_at = time.monotonic()
        return self.fields


_copy = _Copy()
