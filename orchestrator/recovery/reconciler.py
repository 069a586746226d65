"""The reconciler: brings Postgres, Valkey and the broker back into agreement, one tick at a time.

A tick, on one process of the cluster at a time:
1. confirms the cluster leadership (`lock:orch:cluster`, `cluster.leaders`): in the loops
   process the tick runs only on the cluster leader, whose seat it is given as its lock; a
   reconciler built without one (an operator's `--once`, tests) takes that same lock itself
   (`orchestrator.cluster.locks.LoopLock`). A process that does not hold it does nothing this tick;
2. flushes the pending-write drain (`drain_replay.replay`, under the same lock), first, so a
   terminal write waiting there lands before its run could be judged an orphan;
3. runs one query (`orphans.candidates`) for the active or cancelling runs whose heartbeat
   is older than the threshold and for one page of the runs pending for longer than
   LUMASTRA_PENDING_CHECK_AFTER_S; an idle tick stops here. Candidates with a write still
   waiting in the drain (Postgres down, the drain backing off), their terminal write or a
   stage's end, are left alone: what they did is decided, Postgres just does not have it yet;
4. ends the orphans among the stale runs (`recovery.orphans`: the Postgres heartbeat and
   the state-hash guard must agree);
5. re-publishes the pending runs whose message the broker lost, and fails those past
   LUMASTRA_PENDING_DEADLINE_S (`orchestrator.recovery.pending`), leaving alone those a pause
   holds (`orchestrator.recovery.pauses`);
6. repairs the live hashes of runs Postgres has ended but whose live hash still says live (their
   writer died between the two writes), and runs their `finished` hooks
   (`orchestrator.recovery.repair`);
7. runs its chores under the same lock: the repair of chore 6 (`RepairHashes`), the pipelines
   stalled between stages (`AdvanceStalledPipelines`), the live children of parents that ended
   failed or cancelled (`recovery.children`), then any a caller adds (none today:
   coverage rows left `running` are the stage-sweep's to reclaim, `coverage.sweep`). The
   pauses' Valkey mirror is rebuilt by the leader's `windows` loop (`recovery.windows`).

Boot recovery: each loops process runs one tick as soon as it starts (`tick(boot=True)`),
with LUMASTRA_ORPHAN_BOOT_THRESHOLD_S (2 min) instead of LUMASTRA_ORPHAN_THRESHOLD_S (5 min),
in the reconciler's own thread, so it never holds up the process's other loops or the worker
pools, and logs what it did. Later ticks come every LUMASTRA_RECONCILE_INTERVAL_S (30 s).

Every write is fenced: before each run's writes the lock is checked and renewed by one
atomic Lua compare (`FencedLock.check`); a tick that has lost its lock stops writing at once.
Every write is also a compare-and-set in Postgres, so two processes that both believed they
held the lock could not end one run twice.

Each run is handled alone: one that fails is logged with its run id and counted in the
tick's report, and the tick carries on; a run deleted or changed since the query is left
alone. A tick never overlaps another tick of the same reconciler (a concurrent call returns
at once, reported as skipped).

Options: LUMASTRA_ORPHAN_THRESHOLD_S, LUMASTRA_ORPHAN_BOOT_THRESHOLD_S,
LUMASTRA_PENDING_CHECK_AFTER_S, LUMASTRA_PENDING_DEADLINE_S, LUMASTRA_RECONCILE_INTERVAL_S;
BATCH, the most stale runs and pending runs one tick looks at.

Not guaranteed:
- Recovery time: an orphan is ended between the threshold and the threshold plus one
  interval after its last heartbeat. If the leader dies, another process leads within
  LUMASTRA_LEADER_TTL_S plus jitter (`orchestrator.cluster.leaders`). In the loops process the boot
  tick is the first tick the process leads (at once when it wins the race at start). A
  reconciler outside one whose boot tick finds the lock held elsewhere skips it; the holder
  recovers those runs at the regular threshold.
- Pending runs are covered a page of BATCH per tick, oldest first, starting over when a page
  comes back short, so a big backlog is checked over several ticks.
- Pipeline runs stalled between stages are moved on by their own chore
  (`recovery.stages`); the orphan query leaves them alone (no stage of theirs runs).
- See `recovery.orphans`, `recovery.pending` and `recovery.drain_replay` for theirs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings

from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.cluster.locks import Fence, FencedLock, LockLost, LoopLock
from orchestrator.recovery import drain_replay, orphans, pauses, pending
from orchestrator.recovery.children import CancelChildrenLeft
from orchestrator.recovery.drain_replay import ReplayReport
from orchestrator.recovery.orphans import SCAN_START, OrphanReport
from orchestrator.recovery.pending import PendingReport
from orchestrator.recovery.repair import RepairHashes
from orchestrator.recovery.stages import AdvanceStalledPipelines
from orchestrator.runs import drain
from orchestrator.stores import counters

log = logging.getLogger(__name__)

NAME = "reconciler"
BATCH = 500


class Chore(Protocol):
    """One more thing a tick reconciles, after the runs, under the tick's lock.

    `fence.check()` before each write batch; returns how many rows it changed. A chore that
    raises is logged and counted, and the tick carries on with the next chore."""

    name: str

    def __call__(self, fence: Fence) -> int: ...


@dataclass
class TickReport:
    boot: bool = False
    skipped: bool = False  # another process holds the lock, or a tick was already running
    lost_lock: bool = False  # the lock was lost mid-tick; the tick stopped writing
    stale: int = 0  # active/cancelling runs past the threshold in Postgres
    pending_checked: int = 0
    in_drain: int = 0  # candidates left alone: their end, or a stage's, waits in the drain
    held: int = 0  # pending runs a pause holds: neither published again nor failed
    orphans: OrphanReport = field(default_factory=OrphanReport)
    pending: PendingReport = field(default_factory=PendingReport)
    drain: ReplayReport = field(default_factory=ReplayReport)
    chores: dict[str, int] = field(default_factory=dict)
    errors: int = 0  # chores that raised (per-run errors are in liveness and pending)

    @property
    def acted(self) -> int:
        """Runs this tick changed or published."""
        return (
            self.orphans.put_back
            + self.orphans.orphaned
            + self.orphans.cancelled
            + self.pending.republished
            + self.pending.failed
            + self.pending.stale_version
            + self.drain.done
            + sum(self.chores.values())
        )

    def summary(self) -> str:
        return (
            f"{self.orphans.orphaned} orphans failed, {self.orphans.put_back} put back, "
            f"{self.orphans.cancelled} cancelled, "
            f"{self.orphans.kept_alive} kept alive by their live hash, "
            f"{self.pending.republished} pending runs published again, "
            f"{self.pending.failed} failed past the pending deadline, "
            f"{self.pending.stale_version} stale versions, "
            f"{self.drain.done} drained writes, "
            + "".join(f"{name}: {count}, " for name, count in self.chores.items() if count)
            + f"{self.orphans.errors + self.pending.errors + self.errors} errors"
        )


class Reconciler:
    def __init__(
        self,
        *,
        chores: Sequence[Chore] = (),
        clock: Clock = SYSTEM,
        batch: int = BATCH,
        lock: FencedLock | None = None,
    ) -> None:
        config = settings.CONFIG
        # The repair of left-behind hashes and the pipelines stalled between stages are always
        # chores; a caller may add more.
        self.chores: tuple[Chore, ...] = (
            RepairHashes(),
            AdvanceStalledPipelines(),
            CancelChildrenLeft(),
            *chores,
        )
        self.clock = clock
        self.batch = batch
        # The cluster seat: a leader's (never acquired here), or the same lock taken directly.
        self.lock: FencedLock = lock or LoopLock(CLUSTER, timedelta(seconds=config.leader_ttl_s))
        self._running = threading.Lock()
        self._pending_after: tuple[datetime, str] = SCAN_START
        shortest = min(config.orphan_threshold_s, config.orphan_boot_threshold_s)
        if shortest < 2 * config.heartbeat_interval_s:
            log.warning(
                "orphan threshold %ss is less than twice the heartbeat interval %ss: "
                "live runs may be failed as orphans",
                shortest,
                config.heartbeat_interval_s,
            )

    def tick(self, *, boot: bool = False) -> TickReport:
        report = TickReport(boot=boot)
        if not self._running.acquire(blocking=False):
            report.skipped = True
            return report
        try:
            if not self.lock.hold():
                report.skipped = True
                if boot:
                    log.info(
                        "boot recovery skipped: %s is held by %s",
                        self.lock.key,
                        self.lock.holder(),
                    )
                return report
            try:
                self._tick(report, boot)
            except LockLost as exc:
                report.lost_lock = True
                log.warning("%s: %s; this tick stops writing", NAME, exc)
        finally:
            self._running.release()
        if boot:
            log.info("boot recovery: %s", report.summary())
        elif report.acted or report.orphans.errors or report.pending.errors or report.errors:
            log.info("%s tick: %s", NAME, report.summary())
        counters.add_many(
            counters.RECOVERY,
            {
                ("orphans_put_back",): report.orphans.put_back,
                ("orphans_failed",): report.orphans.orphaned,
                ("republished",): report.pending.republished,
                ("pending_failed",): report.pending.failed,
            },
        )
        return report

    def release(self) -> None:
        """Hand the lock over at once (on shutdown) instead of letting its lease run out."""
        self.lock.release()

    def _tick(self, report: TickReport, boot: bool) -> None:
        config = settings.CONFIG
        threshold = config.orphan_boot_threshold_s if boot else config.orphan_threshold_s
        report.drain = drain_replay.replay(fence=self.lock)
        stale, waiting = orphans.candidates(
            stale_after_s=threshold,
            pending_after_s=config.pending_check_after_s,
            limit=self.batch,
            pending_after=self._pending_after,
        )
        report.stale, report.pending_checked = len(stale), len(waiting)
        # The next tick reads the next page of pending runs; a short page starts over.
        last = waiting[-1] if len(waiting) >= self.batch else None
        self._pending_after = (last.created_at, last.run_id) if last else SCAN_START
        if stale or waiting:
            # A run whose end, or a stage's end, waits in the drain has moved on; Postgres
            # just does not know yet. It is neither an orphan nor a pending run to publish
            # again, and its stage is not lost.
            drained = drain.waiting_run_ids()
            report.in_drain = sum(c.run_id in drained for c in (*stale, *waiting))
            stale = [c for c in stale if c.run_id not in drained]
            waiting = [c for c in waiting if c.run_id not in drained]
        if stale:
            report.orphans = orphans.end_orphans(
                stale, threshold, fence=self.lock, clock=self.clock
            )
        if waiting:
            # A paused run waits on purpose: not lost, not stuck (`recovery.pauses`).
            holds = pauses.Holds.load(config.pending_deadline_s)
            waiting, report.held = holds.sort(waiting)
        if waiting:
            report.pending = pending.check(
                waiting,
                deadline_s=config.pending_deadline_s,
                claim_stale_after_s=threshold,
                fence=self.lock,
                clock=self.clock,
            )
        for chore in self.chores:
            try:
                self.lock.check()
                report.chores[chore.name] = chore(self.lock)
            except LockLost:
                raise
            except Exception:
                report.errors += 1
                log.exception("%s: chore %s failed", NAME, chore.name)
