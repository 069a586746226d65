"""The pending-write drain, the writer's side: a write Postgres refused on a transient error
waits in Valkey for its replay (`orchestrator.recovery.drain_replay`).

Two writes go to the drain when they fail with a transient database error
(`TRANSIENT_ERRORS`: Postgres restarting or unreachable, a dropped connection, a lock timeout):
a run's end (`runs.terminal.finish`: `durable.end`, or `end_cancelled` for a cancel) and a
pipeline stage's end (`durable.move_stage`: completed, failed, or back to waiting for a retry, from
`runs.pipeline`). The writer calls `push` with that call's name and arguments. The call goes,
as JSON `{run_id, call, target, args, owner, attempts, then}`, onto a bounded Valkey list
(`task:drain:pending`, at most MAX_ENTRIES). The replay makes the same call again, oldest entry
first: the same guarded statement (`stores/sql/end_run.sql`, `move_stage.sql`) with the same
arguments, fenced by the same claim (the run's `owner` for an end, the stage claim's `claimer`
for a stage move), so a replay can never make a move `states.py` forbids nor write anything the
writer would not have. `then` holds what the writer would have used after a stage move and
that Postgres does not keep: the run's error (a failed stage), the retry's delay.

Valkey after Postgres. Valkey must never be ahead of the truth, so a writer whose Postgres
write failed writes nothing to Valkey for it; once Postgres has the write, the replay does
what the writer would have done next, once per applied entry. For an end: the run is settled
(`runs.terminal.settle`: the live hash follows, fenced by the claim's owner, then the `finished`
hooks: concurrency slot, identity, quota counts, circuit). For a stage move: what `runs.pipeline`
registered with `on_stage_move` (the live hash follows, then the advance, the run's failure or
the stage's next message). So after `push` returns True the writer returns without doing
that itself. Until then the run (or the stage) reads `active` in both stores and keeps its slot,
and the reconciler leaves it alone (`waiting_run_ids`, `waiting_stages`).

Not guaranteed: a full list refuses a new entry (`push` returns False). That run stays
`active` until the reconciler fails it as an orphan: it ends, but without the handler's
result; a stage whose end was refused is tried again as a lost stage
(`runs.stage_attempts.put_back_lost_stages`), or fails its run when it has no attempt left. Valkey
being unreachable at push time has the same effect.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError

from orchestrator.states import RunState, StageState
from orchestrator.stores import keys, valkey
from orchestrator.stores.durable import Stages

log = logging.getLogger(__name__)

MAX_ENTRIES = 10_000

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)

# The calls a writer defers to the drain, and the arguments each is given besides run_id and
# target (and, for `end`, owner: the entry's own).
END = "end"
MOVE_STAGE = "move_stage"
END_ARGS = ("finished_at", "result", "error", "step", "progress", "attempt", "started_at")
_ARGS = {
    END: frozenset(END_ARGS),
    MOVE_STAGE: frozenset({"stage", "result", "step", "cost", "claimer", "stale_after_s"}),
}
# `end`'s moments, kept in an entry as ISO 8601 strings (a stage's step record keeps its own
# moments as strings already).
_MOMENTS = ("finished_at", "started_at")


def _checked(call: str, target: str, args: Mapping[str, Any]) -> RunState | StageState:
    """The state `call` moves to; ValueError for a call the drain does not replay, a target
    that call does not write, or a stage move without its stage."""
    if call == END:
        return RunState(target)
    if call == MOVE_STAGE and isinstance(args.get("stage"), str):
        return StageState(target)
    raise ValueError(f"not a call the drain replays: {call!r} with {sorted(args)}")


@dataclass(frozen=True)
class Entry:
    run_id: str
    target: str  # a run state for `end`, a stage state for `move_stage`
    args: dict[str, Any]  # the call's, as JSON: `end`'s moments as ISO 8601 strings
    # The run's claim: fences `end` and the settle after it; a stage move is fenced by its
    # stage claim (`args["claimer"]`), and what follows it is written as this claim.
    owner: str
    attempts: int = 0  # replays that failed on a transient error
    call: str = END
    # What the writer would have used after a stage move and Postgres does not keep (the
    # run's error for a failed stage, `error`; a retry's delay, `delay_s`, and kind, `kind`).
    then: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        data = {
            "run_id": self.run_id,
            "call": self.call,
            "target": self.target,
            "args": self.args,
            "owner": self.owner,
            "attempts": self.attempts,
        }
        if self.then:
            data["then"] = self.then
        return json.dumps(data)

    @classmethod
    def from_json(cls, raw: str) -> Entry:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a drain entry")
        if data.get("call") not in _ARGS or not isinstance(data.get("args"), dict):
            raise ValueError(f"not a drain entry of {sorted(_ARGS)}")
        call, args = data["call"], data["args"]
        then = data.get("then", {})
        if not isinstance(then, dict):
            raise ValueError("not a drain entry: `then` is not an object")
        target = str(data["target"])
        _checked(call, target, args)
        return cls(
            run_id=str(data["run_id"]),
            target=target,
            args=args,
            owner=str(data.get("owner", "")),
            attempts=int(data.get("attempts", 0)),
            call=call,
            then=then,
        )

    def call_args(self) -> dict[str, Any]:
        """The arguments as the call takes them (`end`'s moments parsed back)."""
        decoded = dict(self.args)
        if self.call == END:
            for name in _MOMENTS:
                if isinstance(decoded.get(name), str):
                    decoded[name] = datetime.fromisoformat(decoded[name])
        return decoded


# What follows a replayed stage move, as its writer would have done it, given the stages as
# the move left them. `runs.pipeline` registers it when imported (by the app's Celery task
# registration, so in every process): it writes through the drain, which cannot import it.
StageFollowUp = Callable[[Entry, Stages], None]
_stage_follow_up: StageFollowUp | None = None


def on_stage_move(follow_up: StageFollowUp) -> StageFollowUp:
    """Register what follows a replayed stage move (one, `runs.pipeline`'s)."""
    global _stage_follow_up
    _stage_follow_up = follow_up
    return follow_up


def stage_follow_up() -> StageFollowUp | None:
    """What `runs.pipeline` registered, for the replay; None where it is not loaded."""
    return _stage_follow_up


def push(
    run_id: str,
    target: RunState | StageState,
    args: Mapping[str, Any],
    owner: str,
    *,
    call: str = END,
    then: Mapping[str, Any] | None = None,
) -> bool:
    """Queue a write Postgres refused on a transient error; False when the drain is full.
    `args` are the failed call's keyword arguments: for `end` (the default), besides `owner`
    (`finished_at`, `result`, `error`, `step`, `progress`, `attempt`, `started_at`); for
    `move_stage`, besides run_id and target (`stage`, `result`, `step`, `cost`, `claimer`,
    `stale_after_s`), with `then` what follows the move needs (see `Entry.then`) and `owner`
    the run's claim. Plain JSON values or datetimes. The replay makes that same call, then
    what the writer would have done after it (see the module docstring).

    For the writer: after True, skip what follows the write (the replay does it once Postgres
    has the write). After False, or a redis error (Valkey is unreachable too), the write is
    lost: log it; the reconciler ends the run as an orphan (tries a stage again as lost).
    Raises ValueError for an argument or a target the call does not take (a bug, not an
    outage).
    """
    unknown = set(args) - _ARGS.get(call, frozenset())
    if unknown:
        raise ValueError(f"run {run_id}: not arguments of durable.{call}(): {sorted(unknown)}")
    state = _checked(call, target, args)
    encoded = json.loads(json.dumps(dict(args), cls=DjangoJSONEncoder))
    follow = json.loads(json.dumps(dict(then or {}), cls=DjangoJSONEncoder))
    entry = Entry(run_id, state.value, encoded, owner, call=call, then=follow)
    length = valkey.script("drain_push", [keys.drain_pending()], [entry.to_json(), MAX_ENTRIES])
    # Worded apart: the fault battery counts each kind of deferred write from the logs.
    if call == END:
        what, waits = f"terminal write {entry.target}", "queued in"
        after = "end the run as an orphan"
    else:
        what, waits = f"stage {args['stage']} {entry.target}", "waits in"
        after = "try the stage again"
    if not length:
        log.error(
            "run %s: drain full (%s entries); %s lost, the reconciler will %s",
            run_id,
            MAX_ENTRIES,
            what,
            after,
        )
        return False
    log.warning("run %s: %s %s the drain", run_id, what, waits)
    return True


def depth() -> tuple[int, int]:
    """(entries waiting or in flight, poisoned entries)."""
    pipe = valkey.client().pipeline(transaction=False)
    pipe.llen(keys.drain_pending())
    pipe.llen(keys.drain_inflight())
    pipe.llen(keys.drain_poison())
    waiting, inflight, poison = valkey.execute(pipe)
    return int(waiting) + int(inflight), int(poison)


def waiting_run_ids() -> set[str]:
    """Runs with a write waiting in the drain (pending or in flight), their end or a stage's:
    the reconciler must not judge them orphans, what they did is already decided. One round
    trip."""
    return {entry.run_id for entry in _waiting()}


def waiting_stages(run_id: str) -> set[str]:
    """The stages of `run_id` whose end waits in the drain: not lost, whatever their run's
    heartbeat says, so not tried again. One round trip."""
    return {
        entry.args["stage"]
        for entry in _waiting()
        if entry.call == MOVE_STAGE and entry.run_id == run_id
    }


def _waiting() -> list[Entry]:
    pipe = valkey.client().pipeline(transaction=False)
    pipe.lrange(keys.drain_pending(), 0, -1)
    pipe.lrange(keys.drain_inflight(), 0, -1)
    found = []
    for raw in itertools.chain.from_iterable(cast(list[list[str]], valkey.execute(pipe))):
        try:
            found.append(Entry.from_json(raw))
        except (ValueError, KeyError, TypeError):
            continue
    return found
