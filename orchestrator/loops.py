"""The worker role's orchestrator loops: `python -m orchestrator.loops`.

One process per worker host (`lumastra.workers` starts it beside the Celery pools), running
each loop in its own named thread, beside the `leader` thread (`orchestrator.cluster.leaders`)
that races for `lock:orch:cluster`, the one leader seat:

- `reconciler` (`recovery.reconciler`), on the cluster leader only: its first tick is boot
  recovery, with the boot threshold, as soon as this process leads (at once when it wins the
  race at start); then one tick every LUMASTRA_RECONCILE_INTERVAL_S (30 s).
- `drain` (`orchestrator.recovery.drain_replay.replay`), on the cluster leader only: one pass every
  LUMASTRA_DRAIN_INTERVAL_S (5 s), backing off while passes fail. An empty drain costs one
  Valkey round trip.
- `due` (`orchestrator.runs.due.release`), on the cluster leader only: publishes the delayed
  starts whose time has come, every LUMASTRA_DUE_POLL_S (0.25 s); one indexed query when none is.
- `turns` (`orchestrator.runs.due.release_turns`), on the cluster leader only: publishes the
  keyed-concurrency runs whose key's turn came when a holder's lease ran out or a dispatched
  run's message was lost (`orchestrator.hooks.keyed`), every `due.TURNS_S` (1 s); one Valkey
  call per task that declares `concurrency=`, none for the others.
- `batches` (`orchestrator.runs.children.release_when_done`), on the cluster leader only: acts
  once on each batch of runs whose runs have all ended (a parent's stage that awaits its
  children, a batch's callbacks), woken by a Postgres notification when a batch is done, and
  looking every LUMASTRA_DUE_POLL_S (0.25 s) besides; an idle tick is LISTEN, one indexed
  query, a wait on the connection and UNLISTEN.
- `windows` (`orchestrator.recovery.windows.tick`), on the cluster leader only: makes the
  pauses' Valkey mirror say which pauses are in force and which run windows are closed,
  publishes what a window held when it opens, and asks the running runs of a closed `stop`
  window to stop, every `orchestrator.windows.TICK_S` (1 s); two queries (`run_window`,
  `task_pause`) and two Valkey round trips when nothing changes, a query more while a `stop`
  window is closed.
- `quota-rollup` (`orchestrator.hooks.quotas.rollup`), on the cluster leader only: copies the
  daily run counts of tasks without a cap from Valkey into `task_quota_usage` every
  LUMASTRA_QUOTA_ROLLUP_INTERVAL_S (30 s); one Valkey pipeline and at most one statement.
  The same tick copies the tasks' daily spend (`orchestrator.hooks.costs.rollup`).
- `scheduler` (`orchestrator.scheduler.dynamic`), on every worker host (its bucket locks make
  one fire per slot, so it needs no leader): its first tick is the static schedules' boot
  catch-up and a tick; then it fires due dynamic-schedule rows every LUMASTRA_SCHEDULER_TICK_S.
- `leftovers` (`orchestrator.runs.leftovers.sweep`), on every worker host: kills the
  processes runs' commands left behind once the pool process that started them is gone,
  every LUMASTRA_RECONCILE_INTERVAL_S (the worker role also sweeps once as it starts).
- `webhooks` (`orchestrator.webhooks.delivery`), on the cluster leader only: run events out to
  the webhook endpoints every LUMASTRA_WEBHOOK_INTERVAL_S.
- `notifications` (`orchestrator.notifications.delivery`), on the cluster leader only: operators'
  notifications out to LUMASTRA_NOTIFY_URLS every LUMASTRA_NOTIFY_INTERVAL_S; one indexed query
  when none is due.
- the loops of the apps above the engine, from `settings.LUMASTRA_LOOP_FACTORIES`: the coverage
  `stage-sweep` and `outbox-dispatcher` (`coverage.loops`), on the cluster leader only.

A loop of the leader (`Loop.leader`) ticks only while this process leads the cluster, checked
locally before each tick (a non-leader's loop costs nothing); its writes are fenced by the
seat (`Leadership.check`, an atomic compare in Lua), so a leader that lost the seat mid-tick
stops writing at its next write batch. Every other loop runs on every worker host.

A loop never overlaps itself: the next tick is due one interval after the previous one
started, and a tick that overran its interval is followed at once by one tick, not by a
burst. A tick that raises is logged with the loop's name and the loop carries on. Each thread
has its own database connection, checked around every tick: a broken or expired connection
is replaced, so a Postgres restart costs the ticks that ran during it, not the process.

SIGTERM or SIGINT stops the process cleanly: each loop finishes the tick it is in, the
leader releases the seat so another host takes over at once, and the process exits 0.
A tick still running after STOP_TIMEOUT_S is abandoned (the process exits anyway).

`--once` makes one attempt at the seat, runs the boot tick, one drain pass and one quota
rollup (if it won the seat), releases the seat and exits (for operators and tests).

It refuses to start (exit 2) unless LUMASTRA_WORKER_MODE=enabled: the web role runs no loops.

Not guaranteed: a tick blocked in a call that never returns (a Postgres statement without a
timeout) stalls its loop until that call returns; the other loop keeps going.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import django

log = logging.getLogger("orchestrator.loops")

STOP_TIMEOUT_S = 30.0
# How soon the main thread sees a SIGTERM or SIGINT (it polls the handler's note).
SIGNAL_POLL_S = 0.1
# How often a loop of the leader looks again while this process does not lead (a local
# check, no I/O).
FOLLOWER_POLL_S = 0.5


@dataclass(frozen=True)
class Loop:
    name: str
    interval_s: float
    tick: Callable[[], object]
    # The first tick, if it differs (the reconciler's boot recovery).
    first: Callable[[], object] | None = None
    # True: ticks only while this process leads the cluster (`cluster.leaders`).
    leader: bool = False


def run_tick(name: str, body: Callable[[], object]) -> None:
    """One tick with the connection hygiene of a long-lived thread; never raises."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        body()
    except Exception:
        log.exception("loop %s: tick failed; the loop carries on", name)
    finally:
        close_old_connections()


def run_loop(loop: Loop, stop: threading.Event, leads: Callable[[], bool] | None = None) -> None:
    """Tick `loop` until `stop`; a loop of the leader ticks only while `leads()`, and its
    `first` tick is the first one it runs as leader."""
    from django.db import connections

    if loop.leader and leads is None:
        raise ValueError(f"loop {loop.name} runs on the leader: it needs a leader check")
    body = loop.first or loop.tick
    try:
        while not stop.is_set():
            if loop.leader and leads is not None and not leads():
                stop.wait(min(loop.interval_s, FOLLOWER_POLL_S))
                continue
            started = time.monotonic()
            run_tick(loop.name, body)
            body = loop.tick
            stop.wait(max(0.0, loop.interval_s - (time.monotonic() - started)))
    finally:
        connections.close_all()
        log.info("loop %s stopped", loop.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.loops", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="run the boot tick, one drain pass and one quota rollup, then exit",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    from django.conf import settings
    from django.utils.module_loading import import_string

    from orchestrator.cluster import leaders, roster
    from orchestrator.hooks import costs, quotas
    from orchestrator.notifications import targets
    from orchestrator.notifications.delivery import Notifier
    from orchestrator.recovery import drain_replay, windows
    from orchestrator.recovery.reconciler import Reconciler
    from orchestrator.runs import children, due, leftovers
    from orchestrator.scheduler.dynamic import Scheduler
    from orchestrator.webhooks.delivery import Deliverer
    from orchestrator.windows import TICK_S

    config = settings.CONFIG
    # Compared by value: the engine reads its configuration through settings and never
    # imports the project package (lumastra).
    if config.worker_mode.value != "enabled":
        print(
            "LUMASTRA_WORKER_MODE is not 'enabled': this process may not run the loops",
            file=sys.stderr,
        )
        return 2

    try:
        elector = leaders.Elector()
    except ValueError as exc:
        print(f"leader settings: {exc}", file=sys.stderr)
        return 2
    try:
        notifier = Notifier(targets.parse(config.notify_urls))
    except targets.InvalidTarget as exc:
        print(str(exc), file=sys.stderr)
        return 2
    cluster = elector.fence()
    reconciler = Reconciler(lock=cluster)
    scheduler = Scheduler()
    deliverer = Deliverer()
    stop = threading.Event()
    loops = [
        Loop(
            "reconciler",
            config.reconcile_interval_s,
            reconciler.tick,
            first=lambda: reconciler.tick(boot=True),
            leader=True,
        ),
        Loop(
            "drain",
            config.drain_interval_s,
            lambda: drain_replay.replay(fence=cluster),
            leader=True,
        ),
        Loop("due", config.due_poll_s, lambda: due.release(fence=cluster), leader=True),
        Loop("turns", due.TURNS_S, lambda: due.release_turns(fence=cluster), leader=True),
        Loop(
            "batches",
            config.due_poll_s,
            lambda: children.release_when_done(fence=cluster, wait_s=config.due_poll_s),
            leader=True,
        ),
        Loop("windows", TICK_S, lambda: windows.tick(fence=cluster), leader=True),
        Loop(
            "quota-rollup",
            config.quota_rollup_interval_s,
            lambda: quotas.rollup(fence=cluster) + costs.rollup(fence=cluster),
            leader=True,
        ),
        Loop("scheduler", config.scheduler_tick_s, scheduler.tick, first=scheduler.boot),
        Loop("leftovers", config.reconcile_interval_s, leftovers.sweep),
        Loop(
            "webhooks",
            config.webhook_interval_s,
            lambda: deliverer.tick(fence=cluster),
            leader=True,
        ),
        Loop(
            "notifications",
            config.notify_interval_s,
            lambda: notifier.tick(fence=cluster),
            leader=True,
        ),
    ]
    # Loops of the apps above the engine (the coverage sweep and dispatcher), named in
    # settings so the engine never imports them; a factory that refuses stops the start.
    try:
        for factory in settings.LUMASTRA_LOOP_FACTORIES:
            loops += import_string(factory)(cluster)
    except ValueError as exc:
        print(f"loops: {exc}", file=sys.stderr)
        return 2
    roster.keep_announcing(roster.this_node("loops", [], pools=roster.host_pools()), stop)
    if args.once:
        elector.step()
        for loop in loops:
            if not loop.leader or elector.leads():
                run_tick(loop.name, loop.first or loop.tick)
        elector.hand_over()
        return 0

    # The handler only notes the signal; the main thread stops the loops. `stop.set()` takes
    # the event's lock, and a handler runs in the main thread between any two bytecodes, also
    # inside `stop.wait` while that thread holds the same lock: the worker role's SIGTERM
    # close behind its process group's (honcho, `make run`) deadlocked this process there,
    # every loop thread waiting on the lock, until the role killed it.
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # One attempt at the seat before the loops start, so a process that wins it at start
    # runs its boot recovery at once; then the leader thread keeps the race.
    elector.step()
    leader_thread = elector.start(stop)
    threads = [
        threading.Thread(
            target=run_loop,
            args=(loop, stop, elector.leads),
            name=f"loop-{loop.name}",
            daemon=True,
        )
        for loop in loops
    ]
    for thread in threads:
        thread.start()
    log.info(
        "loops started: %s",
        ", ".join(f"{loop.name} every {loop.interval_s}s" for loop in loops),
    )
    log.info(
        "leader: racing for %s (lease %ss, renewed every %ss, jitter up to %ss)",
        elector.lock.key,
        config.leader_ttl_s,
        config.leader_renew_s,
        config.leader_jitter_s,
    )
    while not received:
        time.sleep(SIGNAL_POLL_S)
    log.info("loops: %s received, stopping", signal.Signals(received[0]).name)
    # The stop is bounded by STOP_TIMEOUT_S; a later signal (the role's, after the group's)
    # changes nothing, and ignored it cannot end the process at its exit with the signal's
    # status instead of 0.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop.set()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning("%s still in a tick after %ss; exiting anyway", thread.name, STOP_TIMEOUT_S)
    # The leader thread releases the seat once `stop` is set; wait for it, then make sure.
    leader_thread.join(timeout=max(1.0, deadline - time.monotonic()))
    elector.hand_over()
    log.info("loops stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
