"""Replaying the pending-write drain (`orchestrator.runs.drain`: what waits there and why).

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
  It moves to the poison list for an operator (`drain_poison`).

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
step); MAX_ATTEMPTS, BACKOFF_CAP, BATCH and APPLY_LOCK_TIMEOUT below; `runs.drain.MAX_ENTRIES`
and `drain_poison.POISON_CAP` bound the two lists.

Not guaranteed:
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
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction

from orchestrator.backoff import exponential
from orchestrator.clock import span_ms
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.cluster.locks import FencedLock, LockLost, LoopLock
from orchestrator.models import TaskHistory
from orchestrator.recovery import drain_poison
from orchestrator.runs import terminal
from orchestrator.runs.drain import END_ARGS, MOVE_STAGE, TRANSIENT_ERRORS, Entry
from orchestrator.runs.drain import stage_follow_up as registered_stage_follow_up
from orchestrator.runs.ending import End, Replay, Written
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import counters, durable, keys, queries, valkey
from orchestrator.stores.durable import Stages

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 10
BACKOFF_CAP = timedelta(seconds=60)
# Entries applied per pass at most, so one pass of a long backlog does not hold the lock forever.
BATCH = 500
# A terminal write waits this long for a row lock before counting as a transient failure.
APPLY_LOCK_TIMEOUT = timedelta(seconds=5)
# Failed passes in a row, remembered across backoffs (reset by a pass without failure).
FAILURES_TTL = timedelta(hours=1)
# Held by this process's pass (see the module docstring).
_PASS = threading.Lock()


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
        drain_poison.add(raw, None, f"unreadable: {exc}")
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
            drain_poison.add(raw, failed, f"{type(exc).__name__}: {exc}")
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
        drain_poison.add(raw, entry, f"{type(exc).__name__}: {exc}")
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
            cursor.execute(queries.DRAIN_LOCK_TIMEOUT, {"timeout": f"{timeout_ms}ms"})
        yield


def _apply_end(entry: Entry, lock_timeout: timedelta) -> Applied:
    """The writer's own end, made again through the one end (`terminal.finish`): fenced by its
    claim, so a run put back to pending after that claim's worker was lost, and claimed anew,
    is not ended by it (`runs.put_back`); a cancel that raced the handler's end wins there."""
    args = entry.call_args()
    end = End(
        entry.run_id,
        "",
        RunState(entry.target),
        entry.owner,
        **{name: args[name] for name in END_ARGS if name in args},
    )
    replay = Replay(
        transaction=functools.partial(_bounded, lock_timeout),
        landed=functools.partial(_landed, entry.run_id, args),
    )
    # Settled inside `finish`: nothing follows it here.
    ended = terminal.finish(end, replay=replay)
    if ended.written is Written.SUPERSEDED:
        log.warning(
            "run %s: drained write %s dropped: the run is %s now",
            entry.run_id,
            entry.target,
            ended.state,
        )
    return ended.written.value, None


def _apply_stage_move(entry: Entry, lock_timeout: timedelta) -> Applied:
    follow_up = registered_stage_follow_up()
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


def _retry(raw: str, entry: Entry) -> None:
    # The cap applies to new entries: one going back may overshoot it by the entries in flight.
    pipe = valkey.client().pipeline(transaction=True)
    pipe.lrem(keys.drain_inflight(), 1, raw)
    pipe.lpush(keys.drain_pending(), entry.to_json())
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
