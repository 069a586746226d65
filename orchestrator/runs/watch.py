"""The watch beside every running handler: heartbeats, the cancel listener and watchdogs.

Threads per worker process (a prefork child runs one run at a time: `Watcher` says which),
started on first use and kept for the process's life, so a run pays no thread start or join,
nor a SUBSCRIBE: the watch thread listens on the process's cancel channel (named by its instance
id, a claimed run's `owner`: `keys.cancel_channel`) from its start. While a run is watched, they:
- trips the context's cancel flag when a message there names the run, not an earlier one
  (`runs.cancel`; "stop": its run window closed, `recovery.windows`); a cancel sent before the
  watch took the run is seen in the hash, which the context reads at most once a second while
  the handler checks, as each heartbeat does;
- writes a plain run's Postgres claim once it has run for CLAIM_AFTER_S: a shorter run's end
  takes its claim with it (`durable.read_claimable`), one write per run instead of two;
- every LUMASTRA_HEARTBEAT_INTERVAL_S stamps `task_history.heartbeat_at` (Postgres clock),
  and writes the claim again if a crash of Postgres lost it (`catch_up.write_live_claim`);
  and, from a thread of its own, the live hash's `heartbeat_at` and TTL (Valkey clock) and
  the run's concurrency lease: a store that hangs stops only its own beat (`Watcher`);
- sends the run's waiting log lines (`runs.context`) and its latest progress report
  (`runs.progress`) about every second, and the last ones when the handler returns;
- runs the watchdogs about every second: a stall failure after the task's `Stall.fail` (else
  its class's LUMASTRA_STALL_FAIL_S_<CLASS>) without progress (`report_progress`, `log`, a
  command's output line), a warning at its `Stall.warn` (else a fifth of the failure's), none
  with `Stall(auto=True)`; the task's hard timeout by the wall clock (a handler that keeps
  yielding but never ends is still stopped), and a cancel not honoured within
  LUMASTRA_CANCEL_ESCALATE_S (a window's stop is not escalated: an unheeding handler finishes).

A watchdog ends the run through `orchestrator.runs.terminal` (Postgres first), then kills the
process running the handler: the only way to stop a wedged thread. Celery's prefork pool replaces
the child; the message comes back (reject on worker lost) and is dropped because the run has ended.
A heartbeat that finds the run owned by someone else kills the handler too (so does a run put back
to pending: `runs.put_back`): its late writes would be refused anyway, and it must not run beside a
successor. A hash Valkey lost (gone, or seeded again owned by nobody) is not someone else's:
Postgres decides, and a plain run it still holds for this handler is claimed in Valkey again and
goes on (`Watcher._claim_again`).

A handler cut off from both stores (no heartbeat confirmed by Postgres or Valkey) for half of
LUMASTRA_ORPHAN_THRESHOLD_S is killed as well: at the threshold the reconciler puts its run back
for another attempt (`runs.put_back`), and the two must not run side by side. That lease is kept by
a thread of its own, on the monotonic clock alone: it takes no lock and calls no store, so a
heartbeat hung on a dead connection cannot stop it (a partition once kept a cut-off handler running
for 26 s past its lease that way). Every store call fails within LUMASTRA_STORE_TIMEOUT_S besides
(`stores/valkey.py`, the Postgres connection options).

Not guaranteed: needs the prefork pool (a kill in a thread pool would take every run of the worker
with it); watchdogs look about once a second, heartbeats once an interval; a handler blocked in
C code dies only by the kill.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import structlog
from django.conf import settings
from django.db import close_old_connections
from redis.client import PubSub
from redis.exceptions import RedisError

from orchestrator.cluster.instance import instance_id
from orchestrator.hooks import dispatch as hooks
from orchestrator.runs import catch_up, retries, terminal
from orchestrator.runs.context import RunContext, capturing
from orchestrator.states import RunState
from orchestrator.stores import durable, keys, live, valkey
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind
from tasks.resources import STALL_WARN_SHARE, default_stall_fail_s

log = logging.getLogger(__name__)

# How often the watchdogs look, whatever the heartbeat interval.
CHECK_EVERY_S = 1.0
# How often the lease thread looks.
LEASE_CHECK_S = 0.25
# A plain run still going this long after its claim has its claim written to Postgres (the
# first tick after it): until then only Valkey knows it runs, and the reconciler reads
# "pending in Postgres, active and fresh in Valkey" as running (`recovery.pending`). Most
# no-op and short runs end before, and their end writes the claim with it.
CLAIM_AFTER_S = 1.0


def _kill_this_process() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(eq=False)
class Watched:
    definition: TaskDefinition
    run_id: str
    owner: str
    context: RunContext
    started: float = field(default_factory=time.monotonic)
    next_beat: float = 0.0
    cancel_seen: float | None = None
    stall_warned: bool = False
    # monotonic time a store last confirmed the run is ours (the claim, then each beat).
    confirmed: float = 0.0
    # The attempt count the run's claim returned: a watchdog's end names it, so it ends the
    # run even if Postgres lost the claim (`durable.end`); None for a pipeline stage's watch.
    attempt: int | None = None
    # When the run's claim was taken, if Postgres has not been told yet
    # (`durable.read_claimable`); None once it has been.
    deferred_since: datetime | None = None
    claim_at: float | None = None  # monotonic time to write that claim
    priority: int = 0  # the run's, to seed its live hash again if Valkey lost it
    next_postgres_beat: float = 0.0

    def __post_init__(self) -> None:
        # The claim stamped the first heartbeat.
        self.next_beat = self.started + settings.CONFIG.heartbeat_interval_s
        self.next_postgres_beat = self.next_beat
        self.confirmed = self.started
        if self.deferred_since is not None:
            self.claim_at = self.started + CLAIM_AFTER_S


class Watcher:
    """Three threads per process: the watch (the process's cancel channel, the Valkey
    heartbeat, the watchdogs, the log and progress flushes), the Postgres beat (the Postgres
    heartbeat and the deferred claim's write) and the lease. Each store has a thread of its
    own, so a store that hangs stops only its own beat: the other still confirms the run, as
    the reconciler judges a run lost only when both stores stopped hearing it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the watch thread's turn
        self._postgres_lock = threading.Lock()  # the Postgres beat's turn
        self._current: Watched | None = None
        self.channel = keys.cancel_channel(instance_id())  # `runs.cancel` sends to the owner's
        for name, target in (
            ("run-watch", self._loop),
            ("run-beat-postgres", self._beat_postgres_loop),
            ("run-lease", self._keep_lease),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()

    def watch(self, watched: Watched) -> None:
        with self._lock:
            self._current = watched

    def unwatch(self, watched: Watched) -> None:
        # Once this returns, neither thread writes for the run (its end follows): each turn is
        # waited for in turn, never both held at once, so a Postgres call that hangs holds up
        # the Valkey beat of no run.
        with self._lock:
            if self._current is watched:
                self._current = None
        with self._postgres_lock:
            pass

    def _beat_postgres_loop(self) -> None:
        while True:
            time.sleep(LEASE_CHECK_S)
            try:
                with self._postgres_lock:
                    watched = self._current
                    if watched is not None:
                        self._beat_postgres(watched)
            except Exception:
                log.exception("run watch: Postgres beat failed")

    def _beat_postgres(self, watched: Watched) -> None:
        now = time.monotonic()
        if watched.claim_at is not None and now >= watched.claim_at:
            self._write_claim(watched)
        try:
            watched.context.write_progress_row()
        except Exception:
            log.exception("run %s: progress not written to its row", watched.run_id)
        if now < watched.next_postgres_beat:
            return
        watched.next_postgres_beat = now + settings.CONFIG.heartbeat_interval_s
        close_old_connections()
        try:
            if durable.heartbeat(watched.run_id, watched.owner) or catch_up.write_live_claim(
                watched.run_id, watched.owner
            ):
                watched.confirmed = time.monotonic()
                watched.claim_at = None
        except Exception:
            # A missed beat is survivable: the thresholds span several.
            log.exception("run %s: heartbeat failed (Postgres)", watched.run_id)

    def _keep_lease(self) -> None:
        while True:
            time.sleep(LEASE_CHECK_S)
            # Read without the lock: the watch thread holds it while it waits on a store.
            watched = self._current
            if watched is not None:
                _stop_if_cut_off(watched)

    def _loop(self) -> None:
        pubsub: PubSub = valkey.client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        while True:
            try:
                self._tick(pubsub)
            except Exception:
                # The thread must outlive any one failure; the reconciler judges the run if
                # its heartbeats stop.
                log.exception("run watch: tick failed")
                time.sleep(CHECK_EVERY_S)

    def _tick(self, pubsub: PubSub) -> None:
        heard = self._listen(pubsub)
        with self._lock:
            if (watched := self._current) is None:
                return
            if heard is not None and heard[0] == watched.run_id:  # the run watched now only
                self._cancel_requested(watched, heard[1])
                if heard[1] == keys.CANCEL_KILL:
                    self._kill_now(watched)
            if time.monotonic() >= watched.next_beat:
                self._beat(watched)
            self._watchdogs(watched)
            self._flush(watched)

    def _listen(self, pubsub: PubSub) -> tuple[str, str] | None:
        """(run id, verb) of the next cancel message within CHECK_EVERY_S, subscribed on the
        first call (redis-py again as it reconnects); Valkey away costs no watchdog its tick."""
        try:
            if not pubsub.subscribed:
                pubsub.subscribe(self.channel)  # type: ignore[no-untyped-call]
            message = pubsub.get_message(timeout=CHECK_EVERY_S)
        except RedisError:
            log.warning("run watch: cancel channel %s unreadable", self.channel, exc_info=True)
            time.sleep(CHECK_EVERY_S)
            return None
        return None if message is None else keys.read_cancel_message(message.get("data"))

    @staticmethod
    def _flush(watched: Watched, *, final: bool = False) -> None:
        """The run's waiting log lines and progress report, sent."""
        try:
            watched.context.run_log.flush()
        except Exception:
            log.exception("run %s: log lines not sent; kept for the next flush", watched.run_id)
        try:
            watched.context.flush_progress(final=final)
        except Exception:
            log.exception("run %s: progress not written", watched.run_id)

    @staticmethod
    def _write_claim(watched: Watched) -> None:
        """The run outlived CLAIM_AFTER_S: its claim goes to Postgres, so Postgres shows it
        running and judges it by its heartbeats from now on."""
        try:
            claimed = durable.claim(
                watched.run_id,
                watched.owner,
                started_at=watched.deferred_since,
                attempt=watched.attempt,
            )
        except Exception:
            log.exception("run %s: claim not written to Postgres; trying again", watched.run_id)
            watched.claim_at = time.monotonic() + CHECK_EVERY_S
            return
        watched.claim_at = None
        if claimed is not None:
            watched.confirmed = time.monotonic()
        elif not terminal.still_ours(watched.run_id, watched.owner):
            # Not pending any more, and not claimed for it (a cancel writes the claim for
            # its owner first, `runs.cancel`): ended or taken meanwhile.
            log.error("run %s: Postgres no longer holds it for us; stopping it", watched.run_id)
            _kill_this_process()

    def _beat(self, watched: Watched) -> None:
        """The Valkey heartbeat (Postgres has its own thread: `_beat_postgres`)."""
        watched.next_beat = time.monotonic() + settings.CONFIG.heartbeat_interval_s
        try:
            state, _, _ = valkey.script(
                "heartbeat_run",
                [keys.run_active(watched.run_id)],
                [watched.owner, settings.CONFIG.run_active_ttl_s],
            )
            hooks.heartbeat(watched.definition, watched.run_id, watched.owner)
        except Exception:
            log.exception("run %s: heartbeat failed (Valkey)", watched.run_id)
            return
        if state in ("", "fenced", RunState.PENDING) and self._claim_again(watched):
            state = RunState.ACTIVE
        if state in (RunState.ACTIVE, RunState.CANCELLING):
            watched.confirmed = time.monotonic()
        # Pending: the run was put back for another attempt, its worker judged lost
        # (`runs.put_back`); this handler must not run beside the next one.
        if state in ("", "fenced", RunState.PENDING):
            log.error("run %s: no longer ours (live state %r); stopping it", watched.run_id, state)
            _kill_this_process()
        elif state == RunState.CANCELLING:
            self._cancel_requested(watched)

    @staticmethod
    def _claim_again(watched: Watched) -> bool:
        """Valkey lost the run's claim (a restart without persistence: the hash is gone, or the
        reconciler seeded it again, pending and owned by nobody, because Postgres had not heard
        of the claim yet: `recovery.pending`). A hash another owner holds is theirs. Otherwise
        Postgres decides: a plain run it still holds for this owner, or
        whose deferred claim it takes now for the attempt that claim read (so nobody claimed
        it meanwhile), is claimed in Valkey again and goes on. Stopping it instead would run
        it again with this attempt uncounted, its claim never written (found by the battery's
        valkey-restart). False, and the caller stops the handler, when Postgres gave the run
        to someone else, a pipeline stage lost its run's hash, or a store failed."""
        if watched.attempt is None:
            return False  # a pipeline's stages live in the lost hash: recovery.stages acts
        run_id, owner = watched.run_id, watched.owner
        try:
            if live.read(run_id).get("owner", "") not in ("", owner):
                return False
            if watched.claim_at is not None and durable.claim(
                run_id, owner, started_at=watched.deferred_since, attempt=watched.attempt
            ):
                watched.claim_at = None
            if not durable.heartbeat(run_id, owner):
                return False
            live.claim_again(run_id, watched.definition.id, watched.priority, owner)
        except Exception:
            log.exception("run %s: its lost live claim could not be taken again", run_id)
            return False
        log.warning("run %s: Valkey lost its claim; Postgres holds it, claimed again", run_id)
        return True

    @staticmethod
    def _cancel_requested(watched: Watched, verb: str = keys.CANCEL) -> None:
        if verb == keys.CANCEL_STOP:  # its window closed: not escalated, the run goes back
            watched.context.stop_for_window()
        elif watched.cancel_seen is None:
            watched.cancel_seen = time.monotonic()
            watched.context.trip_cancel()

    @staticmethod
    def _kill_now(watched: Watched) -> None:
        log.warning("run %s: kill requested by an operator; killing its process", watched.run_id)
        Watcher._flush(watched, final=True)
        terminal.cancel(watched.definition, watched.run_id, watched.owner)
        _kill_this_process()

    def _watchdogs(self, watched: Watched) -> None:
        config = settings.CONFIG
        now = time.monotonic()
        hard = watched.definition.timeout.hard
        if now - watched.started > hard.total_seconds():
            self._end(watched, ErrorKind.TIMEOUT, f"passed its hard timeout of {hard}")
        stall = watched.definition.stall
        quiet_s = now - watched.context.progressed_at
        fail_s = (
            stall.fail.total_seconds()
            if stall.fail
            else default_stall_fail_s(watched.definition.resource_class)
        )
        warn_s = stall.warn.total_seconds() if stall.warn else fail_s * STALL_WARN_SHARE
        if stall.auto:
            pass  # a handler still running counts as alive; only the hard timeout stops it
        elif quiet_s > fail_s:
            self._end(watched, ErrorKind.STALLED, f"no progress for {quiet_s:.0f}s")
        elif quiet_s > warn_s and not watched.stall_warned:
            watched.stall_warned = True
            log.warning("run %s: no progress for %.0fs", watched.run_id, quiet_s)
        if watched.cancel_seen is not None and now - watched.cancel_seen > config.cancel_escalate_s:
            log.warning("run %s: cancel not honoured; killing its process", watched.run_id)
            terminal.cancel(watched.definition, watched.run_id, watched.owner)
            _kill_this_process()

    @staticmethod
    def _end(watched: Watched, kind: ErrorKind, message: str) -> None:
        log.error("run %s: %s; failing it and killing its process", watched.run_id, message)
        # Its last lines and progress first, as a handler that returns has them: followers
        # see them before the end, and the row keeps its tail.
        Watcher._flush(watched, final=True)
        step, progress = watched.context.extras()
        terminal.end(
            watched.definition,
            watched.run_id,
            watched.owner,
            RunState.FAILED,
            error=retries.error_doc(kind, message),
            step=step if not watched.definition.pipeline else None,
            progress=progress,
            attempt=watched.attempt,
            started_at=watched.deferred_since,
        )
        _kill_this_process()


def _stop_if_cut_off(watched: Watched) -> None:
    threshold_s = settings.CONFIG.orphan_threshold_s
    cut_off_s = time.monotonic() - watched.confirmed
    if cut_off_s > threshold_s / 2:
        # Neither store has heard this run for half the orphan threshold: the reconciler will
        # soon put it back for another attempt elsewhere (`runs.put_back`), and this handler
        # must not still be running then.
        log.error(
            "run %s: no heartbeat confirmed for %.0fs (orphan threshold %ss); stopping it",
            watched.run_id,
            cut_off_s,
            threshold_s,
        )
        _kill_this_process()


_watchers: dict[int, Watcher] = {}


def _watcher() -> Watcher:
    # Keyed by pid: a thread does not survive fork, so each pool child starts its own.
    pid = os.getpid()
    if pid not in _watchers:
        _watchers[pid] = Watcher()
    return _watchers[pid]


@contextmanager
def watching(
    definition: TaskDefinition,
    run_id: str,
    owner: str,
    context: RunContext,
    attempt: int | None = None,
    deferred_since: datetime | None = None,
    priority: int = 0,
) -> Iterator[None]:
    """`deferred_since`: when the run's claim was taken, if it is not in Postgres yet; the
    watch writes it after CLAIM_AFTER_S, until the block ends."""
    watched = Watched(
        definition,
        run_id,
        owner,
        context,
        attempt=attempt,
        deferred_since=deferred_since,
        priority=priority,
    )
    watcher = _watcher()
    watcher.watch(watched)
    try:
        with (
            capturing(context.run_log),
            structlog.contextvars.bound_contextvars(
                run_id=run_id, task=definition.id, stage=context.run_log.stage
            ),
        ):
            yield
    finally:
        watcher.unwatch(watched)
        # Before the run's end is written: a follower that sees the end has every line.
        Watcher._flush(watched, final=True)
