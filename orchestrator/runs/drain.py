"""The pending-write drain: writes Postgres refused on a transient error, replayed.

Two writes go to the drain when they fail with a transient database error
(`TRANSIENT_ERRORS`: Postgres restarting or unreachable, a dropped connection, a lock timeout):
a run's terminal write (`durable.end`, from `runs.terminal`) and a pipeline stage's end
(`durable.move_stage`: completed, failed, or back to waiting for a retry, from
`runs.pipeline`). The writer calls `push` with that call's name and arguments. The call goes,
as JSON `{run_id, call, target, args, owner, attempts, then}`, onto a bounded Valkey list
(`task:drain:pending`, at most MAX_ENTRIES). `replay()` makes the same call again, oldest entry
first: the same guarded statement (`stores/sql/end_run.sql`, `move_stage.sql`) with the same
arguments, fenced by the same claim (the run's `owner` for an end, the stage claim's `claimer`
for a stage move), so a replay can never make a move `states.py` forbids nor write anything the
writer would not have. `then` holds what the writer would have used after a stage move and
that Postgres does not keep: the run's error (a failed stage), the retry's delay. Entries
pushed by an older deploy (`{call: "end", …}` without `then`, or `{…, fields}`: the row's
columns) are read as the same end.

Valkey after Postgres. Valkey must never be ahead of the truth, so a writer whose Postgres
write failed writes nothing to Valkey for it; once Postgres has the write, the replay does
what the writer would have done next, once per applied entry. For an end: the run is settled
(`runs.settle`: the live hash follows, fenced by the claim's owner, then the `finished` hooks:
concurrency slot, identity, quota counts, circuit). For a stage move: what `runs.pipeline`
registered with `on_stage_move` (the live hash follows, then the advance, the run's failure or
the stage's next message). So after `push` returns True the writer returns without doing
that itself. Until then the run (or the stage) reads `active` in both stores and keeps its slot,
and the reconciler leaves it alone (`waiting_run_ids`, `waiting_stages`).

What a replay does with an entry:
- applied: Postgres took the write; what follows it is done.
- already: Postgres refused it because it already holds this very write (the UPDATE
  committed but its reply was lost, so the writer pushed a write that had landed; told apart
  by an end's `finished_at`, `error` and `result`, by a stage move's step record and result).
  Done; what follows it is still done, since the writer skipped it.
- cancelled: an end whose run is `cancelling` (a cancel raced the handler's end): it ends
  `cancelled`, as in the runner. A stage move is still made while its run is cancelling, as
  the writer's would be, and so is what follows it: the run ends cancelled once no stage of
  it runs (`runs.pipeline`).
- superseded: the run ended otherwise meanwhile (failed as an orphan, cancelled, or the same
  state written by someone else, who ran the hooks), its stage moved on (claimed anew after
  its claimer was judged lost), or the run is gone; the entry is dropped with a warning.
- retried: a transient error. The entry goes to the back of the list with attempts + 1 and
  the pass ends (Postgres is most likely down for every entry). The next pass is delayed,
  cluster-wide, doubling from LUMASTRA_DRAIN_INTERVAL_S up to BACKOFF_CAP.
- poisoned: MAX_ATTEMPTS transient failures, any other error, or an entry that cannot be read.
  It moves to `task:drain:poison` (newest first, at most POISON_CAP) for an operator;
  `poisoned()` lists them for the admin, `replay_poisoned()` puts one back on the pending
  list (attempts from zero; once the cause is fixed) and `discard_poisoned()` drops one.

One process applies entries at a time: a pass runs under the cluster leadership
(`lock:orch:cluster`, orchestrator/cluster/leaders.py): in the loops process only the cluster
leader replays, checking its seat (`FencedLock.check`, an atomic compare in Lua) before each entry;
called without a fence (an operator, a test), a pass takes that same lock for itself, and
finds it busy while a leader holds it. Within the process one pass runs at a time: the drain
loop and the reconciler's tick both replay, and a pass started beside another would put back
the entry the other is applying, and apply it too. A pass moves each entry to
`task:drain:inflight` while applying it (LMOVE, atomic), so an entry whose replayer died
mid-way is put back by the next pass instead of being lost; so is one whose follow-up raised
(a Valkey or broker error): the next pass finds its write already made and does the
follow-up again.

Options: LUMASTRA_DRAIN_INTERVAL_S (the loop in orchestrator/loops.py, and the first backoff
step); MAX_ENTRIES, MAX_ATTEMPTS, POISON_CAP, BACKOFF_CAP, BATCH and APPLY_LOCK_TIMEOUT below.

Not guaranteed:
- A full list refuses a new entry (`push` returns False). That run stays `active` until the
  reconciler fails it as an orphan: it ends, but without the handler's result; a stage whose
  end was refused is tried again as a lost stage (`runs.pipeline.resume_lost_stages`), or
  fails its run when it has no attempt left. Valkey being unreachable at push time has the
  same effect.
- Hooks exactly once across a replayer crash: an entry applied by a replayer that died before
  removing it is applied again, found already ended that way, and its hooks run again (the
  daily quota then counts the run twice); a stage move's follow-up is done again too (a
  stage published twice: the second message is dropped at its claim).
- Order across runs (a failed entry goes to the back). Within a run: a run has one terminal
  write, and a stage's next attempt or the stages after it start only once its move is
  replayed; the ends of parallel stages may be replayed in any order (each move returns the
  stages as it left them, so the last one advances the run).
- With MAX_ATTEMPTS 10 and the backoff, an entry is poisoned only after several minutes of
  continuous failure (about seven with one entry); a one-minute outage poisons nothing.
  A poisoned entry's run is still `active` in Postgres: the reconciler then ends it as an
  orphan (it ends once, but failed), or tries a poisoned stage again, and the poison list
  keeps what the handler produced.
- A deploy older than stage moves in the drain reads a `move_stage` entry as unreadable and
  poisons it; once the newer deploy leads, an operator replays it from the poison list.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from orchestrator.backoff import exponential
from orchestrator.clock import span_ms
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.cluster.locks import FencedLock, LockLost, LoopLock
from orchestrator.models import TaskHistory
from orchestrator.runs.settle import settle
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import counters, durable, keys, scripts, valkey
from orchestrator.stores.durable import Stages
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

MAX_ENTRIES = 10_000
MAX_ATTEMPTS = 10
POISON_CAP = 10_000
BACKOFF_CAP = timedelta(seconds=60)
# Entries applied per pass at most, so one pass of a long backlog does not hold the lock forever.
BATCH = 500
# A terminal write waits this long for a row lock before counting as a transient failure.
APPLY_LOCK_TIMEOUT = timedelta(seconds=5)
# Failed passes in a row, remembered across backoffs (reset by a pass without failure).
FAILURES_TTL = timedelta(hours=1)
# Held by this process's pass (see the module docstring).
_PASS = threading.Lock()

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)

# The calls a writer defers to the drain, and the arguments each is given besides run_id and
# target (and, for `end`, owner: the entry's own).
END = "end"
MOVE_STAGE = "move_stage"
_ARGS = {
    END: frozenset({"finished_at", "result", "error", "step", "progress", "attempt", "started_at"}),
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
        if "fields" in data:
            call, args = END, _legacy_args(data["fields"])
        elif data.get("call") in _ARGS and isinstance(data.get("args"), dict):
            call, args = data["call"], data["args"]
        else:
            raise ValueError(f"not a drain entry of {sorted(_ARGS)}")
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


def _legacy_args(fields: Any) -> dict[str, Any]:
    """An older deploy's entry held the row's columns (`result`, `error`, `finished_at`, a
    plain run's `steps` as {task: step} with its `cost_breakdown`, `progress`): the same end.
    Its claim's attempt count was not kept, so it cannot end a run whose claim was lost."""
    if not isinstance(fields, dict):
        raise ValueError("not a drain entry")
    args = {
        name: fields[name]
        for name in ("result", "error", "finished_at", "progress")
        if name in fields
    }
    steps = fields.get("steps")
    if isinstance(steps, dict) and len(steps) == 1:
        (args["step"],) = steps.values()
    return args


@dataclass(frozen=True)
class PoisonedEntry:
    """One entry an operator must look at; `raw` is what was pushed, as it was pushed."""

    raw: str
    run_id: str
    target: str
    attempts: int
    error: str
    poisoned_at: str
    # Names the record for replay_poisoned / discard_poisoned (a digest of the record).
    record_id: str = ""
    # False for an entry that could not be read: it can only be discarded.
    replayable: bool = False


class PoisonGone(LookupError):
    """The poisoned record is no longer listed (replayed or discarded by someone else)."""


class NotReplayable(ValueError):
    """The poisoned record holds no readable entry (it can only be discarded)."""


class DrainFull(RuntimeError):
    """The pending list is at MAX_ENTRIES: a replayed entry would not fit."""


@dataclass
class ReplayReport:
    applied: int = 0
    already: int = 0
    cancelled: int = 0
    superseded: int = 0
    retried: int = 0
    poisoned: int = 0
    recovered: int = 0  # entries found in flight (a replayer died) and put back
    busy: bool = False  # another process holds the drain lock
    backing_off: bool = False  # recent passes failed; this one was not due
    lost_lock: bool = False

    @property
    def done(self) -> int:
        return self.applied + self.already + self.cancelled + self.superseded


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
    length = scripts.call("drain_push", [keys.drain_pending()], [entry.to_json(), MAX_ENTRIES])
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


def poisoned(limit: int = 100) -> list[PoisonedEntry]:
    """The newest poisoned entries first, for the admin's triage page."""
    records = cast(list[str], valkey.client().lrange(keys.drain_poison(), 0, limit - 1))
    return [_read_poisoned(record) for record in records]


def replay_poisoned(record_id: str) -> PoisonedEntry:
    """Put a poisoned entry back on the pending list, attempts from zero, for the next pass
    (once the cause is fixed). Atomic with its removal from the poison list
    (`drain_unpoison.lua`). Its run may have ended otherwise meanwhile (the reconciler fails a
    poisoned run as an orphan): the replay then drops it as superseded.
    Raises PoisonGone, NotReplayable or DrainFull (nothing changed)."""
    record, found = _find_poisoned(record_id)
    if not found.replayable:
        raise NotReplayable(f"poisoned record {record_id} holds no readable entry")
    entry = dataclasses.replace(Entry.from_json(found.raw), attempts=0)
    _unpoison(record, record_id, entry.to_json())
    log.warning("run %s: poisoned drain entry %s replayed by an operator", found.run_id, record_id)
    return found


def discard_poisoned(record_id: str) -> PoisonedEntry:
    """Drop a poisoned entry for good; the record is logged first. Raises PoisonGone."""
    record, found = _find_poisoned(record_id)
    log.warning("drain: poisoned record %s discarded by an operator: %s", record_id, record)
    _unpoison(record, record_id, "")
    return found


def _read_poisoned(record: str) -> PoisonedEntry:
    data = json.loads(record)
    entry = data.get("entry") or {}
    return PoisonedEntry(
        raw=str(data.get("raw", "")),
        run_id=str(entry.get("run_id", "")),
        target=str(entry.get("target", "")),
        attempts=int(entry.get("attempts", 0)),
        error=str(data.get("error", "")),
        poisoned_at=str(data.get("poisoned_at", "")),
        record_id=_record_id(record),
        replayable=bool(entry),
    )


def _record_id(record: str) -> str:
    return hashlib.sha1(record.encode(), usedforsecurity=False).hexdigest()


def _find_poisoned(record_id: str) -> tuple[str, PoisonedEntry]:
    records = cast(list[str], valkey.client().lrange(keys.drain_poison(), 0, POISON_CAP - 1))
    for record in records:
        if _record_id(record) == record_id:
            return record, _read_poisoned(record)
    raise PoisonGone(f"poisoned record {record_id} is no longer listed")


def _unpoison(record: str, record_id: str, pushed: str) -> None:
    done = scripts.call(
        "drain_unpoison",
        [keys.drain_poison(), keys.drain_pending()],
        [record, pushed, MAX_ENTRIES],
    )
    if done == 0:
        raise PoisonGone(f"poisoned record {record_id} is no longer listed")
    if done == -1:
        raise DrainFull(f"the drain holds {MAX_ENTRIES} entries; try again once it drained")


def replay(
    *,
    limit: int = BATCH,
    lock_timeout: timedelta = APPLY_LOCK_TIMEOUT,
    force: bool = False,
    fence: FencedLock | None = None,
) -> ReplayReport:
    """One pass: apply up to `limit` entries. An empty drain costs one Valkey round trip.
    `force` ignores the backoff (an operator's flush, tests). `fence` is the cluster seat the
    caller writes under (the leader's, or the reconciler's lock); without one the pass takes
    `lock:orch:cluster` itself and releases it at the end."""
    report = ReplayReport()
    client = valkey.client()
    pipe = client.pipeline(transaction=False)
    pipe.llen(keys.drain_pending())
    pipe.llen(keys.drain_inflight())
    pipe.exists(keys.drain_backoff())
    waiting, inflight, backing_off = valkey.execute(pipe)
    if not waiting and not inflight:
        return report
    if backing_off and not force:
        report.backing_off = True
        return report
    if not _PASS.acquire(blocking=False):
        report.busy = True
        return report
    try:
        return _pass(report, limit, lock_timeout, fence)
    finally:
        _PASS.release()


def _pass(
    report: ReplayReport, limit: int, lock_timeout: timedelta, fence: FencedLock | None
) -> ReplayReport:
    client = valkey.client()
    lease = timedelta(seconds=settings.CONFIG.leader_ttl_s)
    lock: FencedLock = fence or LoopLock(CLUSTER, lease)
    if not lock.hold():
        report.busy = True
        return report
    failed = False
    try:
        report.recovered = _recover_inflight()
        for _ in range(limit):
            lock.check()
            raw = client.lmove(keys.drain_pending(), keys.drain_inflight(), "RIGHT", "LEFT")
            if raw is None:
                break
            if not _replay_one(str(raw), lock_timeout, report):
                failed = True
                break
    except LockLost:
        report.lost_lock = True
        log.warning("drain: lost %s mid-pass; the next pass carries on", lock.key)
    finally:
        if fence is None:
            lock.release()
    _record_pass(failed=failed)
    if report.done or report.poisoned or report.retried:
        log.info("drain: %s", report)
        counters.add_many(
            counters.RECOVERY,
            {("drain_replayed",): report.done, ("poisoned",): report.poisoned},
        )
    return report


def _recover_inflight() -> int:
    """Entries left in flight by a replayer that died go back to the front of the line."""
    client = valkey.client()
    moved = 0
    while client.lmove(keys.drain_inflight(), keys.drain_pending(), "RIGHT", "RIGHT"):
        moved += 1
    if moved:
        log.warning("drain: %s entries left in flight by a stopped replayer put back", moved)
    return moved


def _replay_one(raw: str, lock_timeout: timedelta, report: ReplayReport) -> bool:
    """Apply one in-flight entry and what follows it; False ends the pass (a transient
    failure)."""
    try:
        entry = Entry.from_json(raw)
    except (ValueError, KeyError, TypeError) as exc:
        log.error("drain: unreadable entry poisoned: %r (%s)", raw[:200], exc)
        _poison(raw, None, f"unreadable: {exc}")
        report.poisoned += 1
        return True
    try:
        outcome, follow_up = _apply(entry, lock_timeout)
    except TRANSIENT_ERRORS as exc:
        failed = dataclasses.replace(entry, attempts=entry.attempts + 1)
        if failed.attempts >= MAX_ATTEMPTS:
            log.error(
                "run %s: drain entry poisoned after %s failures: %s",
                entry.run_id,
                failed.attempts,
                exc,
            )
            _poison(raw, failed, f"{type(exc).__name__}: {exc}")
            report.poisoned += 1
        else:
            log.warning(
                "run %s: drain replay failed (attempt %s): %s", entry.run_id, failed.attempts, exc
            )
            _retry(raw, failed)
            report.retried += 1
        return False
    except Exception as exc:
        log.exception("run %s: drain entry poisoned: not a transient error", entry.run_id)
        _poison(raw, entry, f"{type(exc).__name__}: {exc}")
        report.poisoned += 1
        return True
    if outcome == "applied":
        report.applied += 1
    elif outcome == "already":
        report.already += 1
    elif outcome == "cancelled":
        report.cancelled += 1
    else:
        report.superseded += 1
    if follow_up is not None:
        follow_up()
    valkey.client().lrem(keys.drain_inflight(), 1, raw)
    return True


# What `_apply` found and what follows it (None: nothing, the entry was superseded).
Applied = tuple[str, Callable[[], None] | None]


def _apply(entry: Entry, lock_timeout: timedelta) -> Applied:
    """The Postgres write, in one transaction bounded by `lock_timeout`."""
    if entry.call == MOVE_STAGE:
        return _apply_stage_move(entry, lock_timeout)
    return _apply_end(entry, lock_timeout)


@contextmanager
def _bounded(lock_timeout: timedelta) -> Iterator[None]:
    """A transaction whose row locks wait at most `lock_timeout` (then a transient error)."""
    timeout_ms = max(1, span_ms(lock_timeout))
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{timeout_ms}ms"])
        yield


def _apply_end(entry: Entry, lock_timeout: timedelta) -> Applied:
    target = RunState(entry.target)
    args = entry.call_args()
    try:
        with _bounded(lock_timeout):
            outcome = "applied"
            try:
                # The writer's own call: fenced by its claim, so a run put back to pending after
                # that claim's worker was lost, and claimed anew, is not ended by it
                # (`runs.resume`).
                durable.end(entry.run_id, target, owner=entry.owner, **args)
            except IllegalTransition as exc:
                if exc.current != RunState.CANCELLING or not _still_owned(entry):
                    raise
                # A cancel raced the handler's end: the run ends once, as cancelled.
                finished_at = args.get("finished_at") or timezone.now()
                durable.end_cancelled(entry.run_id, finished_at=finished_at)
                outcome = "cancelled"
            task_id = _task_id(entry.run_id)
    except IllegalTransition as exc:
        if exc.current == target.value and _landed(entry.run_id, args):
            outcome, task_id = "already", _task_id(entry.run_id)
        else:
            log.warning(
                "run %s: drained write %s dropped: the run is %s now",
                entry.run_id,
                target,
                exc.current,
            )
            return "superseded", None
    ended = RunState.CANCELLED if outcome == "cancelled" else target
    return outcome, functools.partial(_finish, entry, ended, task_id)


def _apply_stage_move(entry: Entry, lock_timeout: timedelta) -> Applied:
    follow_up = _stage_follow_up
    if follow_up is None:
        # Checked before writing: an entry this process could not follow up is poisoned
        # untouched, for a process that can.
        raise RuntimeError("no follow-up of stage moves registered (runs.pipeline not loaded)")
    target = StageState(entry.target)
    args = entry.call_args()
    try:
        with _bounded(lock_timeout):
            # The writer's own call, fenced by its stage claim: a stage tried again after its
            # claimer was judged lost, and claimed anew, is not ended by it.
            stages = durable.move_stage(entry.run_id, target=target, **args)
    except IllegalTransition as exc:
        landed = _stage_landed(entry.run_id, args) if exc.current == target.value else None
        if landed is None:
            log.warning(
                "run %s: drained stage %s %s dropped: the stage is %s now",
                entry.run_id,
                args["stage"],
                target,
                exc.current,
            )
            return "superseded", None
        return "already", functools.partial(follow_up, entry, landed)
    return "applied", functools.partial(follow_up, entry, stages)


def _still_owned(entry: Entry) -> bool:
    rows = TaskHistory.objects.filter(id=entry.run_id)
    return not entry.owner or rows.filter(owner_instance_id=entry.owner).exists()


def _landed(run_id: str, args: dict[str, Any]) -> bool:
    """Whether the row holds this very write (its reply was lost), not the same end written
    by someone else (a watchdog, say), whose hooks have run already."""
    compared = [name for name in ("finished_at", "error", "result") if name in args]
    found = TaskHistory.objects.filter(id=run_id).values(*compared).first()
    return found is not None and all(found[name] == args[name] for name in compared)


def _stage_landed(run_id: str, args: dict[str, Any]) -> Stages | None:
    """The run's stages when its row holds this very stage move (its reply was lost): the
    stage's step record has this attempt's end, under this claim, and its result; else None.
    A step record's `finished_at` is this attempt's own moment, so a later attempt's end or
    another writer's move does not pass for it."""
    stage = args["stage"]
    found = (
        TaskHistory.objects.filter(id=run_id)
        .values_list("stages", "stage_results", "steps")
        .first()
    )
    if found is None:
        return None
    states, results, records = found
    record = records.get(stage, {})
    step = args.get("step") or {}
    same = all(
        record.get(name) == step[name]
        for name in ("finished_at", "status", "error")
        if name in step
    )
    if args.get("claimer") is not None:
        same = same and record.get("owner") == args["claimer"]
    if args.get("result") is not None:
        same = same and results.get(stage) == args["result"]
    return Stages(states, results) if same else None


def _task_id(run_id: str) -> str | None:
    return TaskHistory.objects.filter(id=run_id).values_list("task_id", flat=True).first()


def _finish(entry: Entry, ended: RunState, task_id: str | None) -> None:
    """What the writer skipped: the run is settled (the live hash follows, hooks hear of it)."""
    kind = None
    error = entry.args.get("error")
    if ended != RunState.CANCELLED and isinstance(error, dict):
        try:
            kind = ErrorKind(error.get("kind"))
        except ValueError:
            kind = None
    settle(entry.run_id, task_id or "", ended, owner=entry.owner, error_kind=kind)


def _retry(raw: str, entry: Entry) -> None:
    # The cap applies to new entries: one going back may overshoot it by the entries in flight.
    pipe = valkey.client().pipeline(transaction=True)
    pipe.lrem(keys.drain_inflight(), 1, raw)
    pipe.lpush(keys.drain_pending(), entry.to_json())
    valkey.execute(pipe)


def _poison(raw: str, entry: Entry | None, error: str) -> None:
    record: dict[str, Any] = {
        "error": error[:2000],
        "poisoned_at": timezone.now().isoformat(),
        "raw": raw,
    }
    if entry is not None:
        record["entry"] = json.loads(entry.to_json())
    pipe = valkey.client().pipeline(transaction=True)
    pipe.lrem(keys.drain_inflight(), 1, raw)
    pipe.lpush(keys.drain_poison(), json.dumps(record))
    pipe.ltrim(keys.drain_poison(), 0, POISON_CAP - 1)
    valkey.execute(pipe)


def _record_pass(*, failed: bool) -> None:
    """Backoff shared by every replayer in the cluster: after `n` failed passes in a row the
    next pass waits interval * 2**n, at most BACKOFF_CAP; a clean pass resets it."""
    client = valkey.client()
    if not failed:
        client.delete(keys.drain_failures(), keys.drain_backoff())
        return
    failures = cast(int, client.incr(keys.drain_failures()))
    client.expire(keys.drain_failures(), FAILURES_TTL)
    interval = timedelta(seconds=settings.CONFIG.drain_interval_s)
    delay = exponential(interval, 2, failures, BACKOFF_CAP)
    client.set(keys.drain_backoff(), failures, px=span_ms(delay))
