"""The pending-write drain: terminal writes Postgres refused on a transient error, replayed.

When a run's terminal write (`durable.end`) fails with a transient database error
(`TRANSIENT_ERRORS`: Postgres restarting or unreachable, a dropped connection, a lock timeout),
the writer calls `push(run_id, target, args, owner)` with that call's arguments. The call goes,
as JSON `{run_id, call: "end", target, args, owner, attempts}`, onto a bounded Valkey list
(`task:drain:pending`, at most MAX_ENTRIES). `replay()` makes the same call again, oldest entry
first: the same guarded statement (`stores/sql/end_run.sql`) with the same arguments, fenced by
the same claim, closing a pipeline's stages as the writer's would have, so a replay can never
make a move DESIGN §4 forbids nor write anything the writer would not have. Entries pushed by
an older deploy (`{…, fields}`: the row's columns) are read as the same call.

Valkey after Postgres. Valkey must never be ahead of the truth, so a writer whose Postgres
write failed does not write the live hash; the replay settles the run once Postgres has the
write (`runs.settle`: the live hash follows, fenced by the claim's owner, then the `finished`
hooks: concurrency slot, identity, quota counts, circuit). So after `push` returns True the writer
returns without settling the run (Valkey write, `finished` hooks): the drain settles it, once
per applied entry. Until then the run reads `active` in both stores and keeps its slot.

What a replay does with an entry:
- applied: Postgres took the write; the run is settled.
- already: Postgres refused it because the run already holds this very write (the UPDATE
  committed but its reply was lost, so the writer pushed a write that had landed; told apart
  by its `finished_at`, `error` and `result`). Done; the run is still settled, since
  the writer skipped them.
- cancelled: the run is `cancelling` (a cancel raced the handler's end): it ends `cancelled`,
  as in the runner.
- superseded: the run ended otherwise meanwhile (failed as an orphan, cancelled, or the same
  state written by someone else, who ran the hooks) or is gone; the entry is dropped with a
  warning.
- retried: a transient error. The entry goes to the back of the list with attempts + 1 and
  the pass ends (Postgres is most likely down for every entry). The next pass is delayed,
  cluster-wide, doubling from LUMASTRA_DRAIN_INTERVAL_S up to BACKOFF_CAP.
- poisoned: MAX_ATTEMPTS transient failures, any other error, or an entry that cannot be read.
  It moves to `task:drain:poison` (newest first, at most POISON_CAP) for an operator;
  `poisoned()` lists them for the admin, `replay_poisoned()` puts one back on the pending
  list (attempts from zero; once the cause is fixed) and `discard_poisoned()` drops one.

One process applies entries at a time: a pass runs under the cluster leadership
(`lock:orch:cluster`, orchestrator/leader.py): in the loops process only the cluster leader
replays, checking its seat (`FencedLock.check`, an atomic compare in Lua) before each entry;
called without a fence (an operator, a test), a pass takes that same lock for itself, and
finds it busy while a leader holds it. It moves each entry to `task:drain:inflight` while
applying it (LMOVE, atomic), so an entry whose replayer died mid-way is put back by the next
pass instead of being lost.

Options: LUMASTRA_DRAIN_INTERVAL_S (the loop in orchestrator/loops.py, and the first backoff
step); MAX_ENTRIES, MAX_ATTEMPTS, POISON_CAP, BACKOFF_CAP, BATCH and APPLY_LOCK_TIMEOUT below.

Not guaranteed:
- A full list refuses a new entry (`push` returns False). That run stays `active` until the
  reconciler fails it as an orphan: it ends, but without the handler's result. Valkey being
  unreachable at push time has the same effect.
- Hooks exactly once across a replayer crash: an entry applied by a replayer that died before
  removing it is applied again, found already ended that way, and its hooks run again (the
  daily quota then counts the run twice).
- Order across runs (a failed entry goes to the back). A run has one terminal write, so
  order within a run does not arise.
- With MAX_ATTEMPTS 10 and the backoff, an entry is poisoned only after several minutes of
  continuous failure (about seven with one entry); a one-minute outage poisons nothing.
  A poisoned entry's run is still `active` in Postgres: the reconciler then ends it as an
  orphan (it ends once, but failed), and the poison list keeps what the handler produced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping
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
from orchestrator.states import IllegalTransition, RunState
from orchestrator.stores import counters, durable, keys, scripts, valkey
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

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)

# The one call a writer defers to the drain (`durable.end`), and the arguments it is given
# besides run_id, target and owner.
CALL = "end"
_ARGS = {"finished_at", "result", "error", "step", "progress", "attempt", "started_at"}
_MOMENTS = ("finished_at", "started_at")


@dataclass(frozen=True)
class Entry:
    run_id: str
    target: str
    args: dict[str, Any]  # `durable.end`'s, as JSON: its moments as ISO 8601 strings
    owner: str
    attempts: int = 0  # replays that failed on a transient error

    def to_json(self) -> str:
        return json.dumps(
            {
                "run_id": self.run_id,
                "call": CALL,
                "target": self.target,
                "args": self.args,
                "owner": self.owner,
                "attempts": self.attempts,
            }
        )

    @classmethod
    def from_json(cls, raw: str) -> Entry:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a drain entry")
        if "fields" in data:
            args = _legacy_args(data["fields"])
        elif data.get("call") == CALL and isinstance(data.get("args"), dict):
            args = data["args"]
        else:
            raise ValueError(f"not a drain entry of {CALL}()")
        return cls(
            run_id=str(data["run_id"]),
            target=str(data["target"]),
            args=args,
            owner=str(data.get("owner", "")),
            attempts=int(data.get("attempts", 0)),
        )

    def call_args(self) -> dict[str, Any]:
        """The arguments as `durable.end` takes them (its moments parsed back)."""
        decoded = dict(self.args)
        for name in _MOMENTS:
            if isinstance(decoded.get(name), str):
                decoded[name] = datetime.fromisoformat(decoded[name])
        return decoded


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


def push(run_id: str, target: RunState, args: Mapping[str, Any], owner: str) -> bool:
    """Queue a terminal write Postgres refused on a transient error; False when the drain is
    full. `args` are the failed `durable.end` call's keyword arguments besides `owner`
    (`finished_at`, `result`, `error`, `step`, `progress`, `attempt`, `started_at`; plain JSON
    values or datetimes); the replay makes that same call, then settles the run (`runs.settle`,
    fenced by `owner`).

    For the writer: after True, skip settling the run (the replay does it once Postgres has
    the write). After False, or a redis error (Valkey is
    unreachable too), the write is lost: log it; the reconciler ends the run as an orphan.
    Raises ValueError for an argument `durable.end` does not take (a bug, not an outage).
    """
    unknown = set(args) - _ARGS
    if unknown:
        raise ValueError(f"run {run_id}: not arguments of durable.{CALL}(): {sorted(unknown)}")
    encoded = json.loads(json.dumps(dict(args), cls=DjangoJSONEncoder))
    entry = Entry(run_id, RunState(target).value, encoded, owner)
    length = scripts.call("drain_push", [keys.drain_pending()], [entry.to_json(), MAX_ENTRIES])
    if not length:
        log.error(
            "run %s: drain full (%s entries); terminal write %s lost, the reconciler will "
            "end the run as an orphan",
            run_id,
            MAX_ENTRIES,
            entry.target,
        )
        return False
    log.warning("run %s: terminal write %s queued in the drain", run_id, entry.target)
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
    """Runs whose terminal write waits in the drain (pending or in flight): the reconciler
    must not judge them orphans, their end is already decided. One round trip when empty."""
    client = valkey.client()
    found: set[str] = set()
    for name in (keys.drain_pending(), keys.drain_inflight()):
        for raw in cast(list[str], client.lrange(name, 0, -1)):
            try:
                found.add(Entry.from_json(raw).run_id)
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
    """Apply one in-flight entry and settle it; False ends the pass (a transient failure)."""
    try:
        entry = Entry.from_json(raw)
        RunState(entry.target)
    except (ValueError, KeyError, TypeError) as exc:
        log.error("drain: unreadable entry poisoned: %r (%s)", raw[:200], exc)
        _poison(raw, None, f"unreadable: {exc}")
        report.poisoned += 1
        return True
    try:
        outcome, task_id = _apply(entry, lock_timeout)
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
    if outcome != "superseded":
        ended = RunState.CANCELLED if outcome == "cancelled" else RunState(entry.target)
        _finish(entry, ended, task_id)
    valkey.client().lrem(keys.drain_inflight(), 1, raw)
    return True


def _apply(entry: Entry, lock_timeout: timedelta) -> tuple[str, str | None]:
    """The Postgres write, in one transaction; returns (outcome, the run's task id)."""
    target = RunState(entry.target)
    args = entry.call_args()
    timeout_ms = max(1, span_ms(lock_timeout))
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{timeout_ms}ms"])
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
            return "already", _task_id(entry.run_id)
        log.warning(
            "run %s: drained write %s dropped: the run is %s now", entry.run_id, target, exc.current
        )
        return "superseded", None
    return outcome, task_id


def _still_owned(entry: Entry) -> bool:
    rows = TaskHistory.objects.filter(id=entry.run_id)
    return not entry.owner or rows.filter(owner_instance_id=entry.owner).exists()


def _landed(run_id: str, args: dict[str, Any]) -> bool:
    """Whether the row holds this very write (its reply was lost), not the same end written
    by someone else (a watchdog, say), whose hooks have run already."""
    compared = [name for name in ("finished_at", "error", "result") if name in args]
    found = TaskHistory.objects.filter(id=run_id).values(*compared).first()
    return found is not None and all(found[name] == args[name] for name in compared)


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
