"""The worker role's orchestrator loops: `python -m orchestrator.loops`.

One process per worker host (`lumastra.workers` starts it beside the Celery pools), running
each loop in its own named thread:

- `reconciler` (`orchestrator.reconciler`): its first tick is boot recovery, at once, with the
  boot threshold; then one tick every LUMASTRA_RECONCILE_INTERVAL_S (30 s). Only the process
  holding `lock:orch:reconciler` writes; the others' ticks cost one Valkey call.
- `drain` (`orchestrator.drain.replay`): one pass every LUMASTRA_DRAIN_INTERVAL_S (5 s),
  backing off while passes fail. An empty drain costs one Valkey round trip.

A loop never overlaps itself: the next tick is due one interval after the previous one
started, and a tick that overran its interval is followed at once by one tick, not by a
burst. A tick that raises is logged with the loop's name and the loop carries on. Each thread
has its own database connection, checked around every tick: a broken or expired connection
is replaced, so a Postgres restart costs the ticks that ran during it, not the process.

SIGTERM or SIGINT stops the process cleanly: each loop finishes the tick it is in, the
reconciler releases its lock so another host takes over at once, and the process exits 0.
A tick still running after STOP_TIMEOUT_S is abandoned (the process exits anyway).

`--once` runs the boot tick and one drain pass, then exits (for operators and tests).

It refuses to start (exit 2) unless WORKER_MODE=enabled: the web role runs no loops.

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


@dataclass(frozen=True)
class Loop:
    name: str
    interval_s: float
    tick: Callable[[], object]
    # The first tick, if it differs (the reconciler's boot recovery).
    first: Callable[[], object] | None = None


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


def run_loop(loop: Loop, stop: threading.Event) -> None:
    from django.db import connections

    body = loop.first or loop.tick
    try:
        while not stop.is_set():
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
        "--once", action="store_true", help="run the boot tick and one drain pass, then exit"
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    from django.conf import settings

    from orchestrator import drain, node
    from orchestrator.reconciler import Reconciler

    config = settings.CONFIG
    # Compared by value: the engine reads its configuration through settings and never
    # imports the project package (lumastra).
    if config.worker_mode.value != "enabled":
        print("WORKER_MODE is not 'enabled': this process may not run the loops", file=sys.stderr)
        return 2

    reconciler = Reconciler()
    stop = threading.Event()
    loops = [
        Loop(
            "reconciler",
            config.reconcile_interval_s,
            reconciler.tick,
            first=lambda: reconciler.tick(boot=True),
        ),
        Loop("drain", config.drain_interval_s, drain.replay),
    ]
    node.keep_announcing(node.this_node("loops", []), stop)
    if args.once:
        for loop in loops:
            run_tick(loop.name, loop.first or loop.tick)
        reconciler.release()
        return 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("loops: %s received, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threads = [
        threading.Thread(target=run_loop, args=(loop, stop), name=f"loop-{loop.name}", daemon=True)
        for loop in loops
    ]
    for thread in threads:
        thread.start()
    log.info(
        "loops started: %s",
        ", ".join(f"{loop.name} every {loop.interval_s}s" for loop in loops),
    )
    while not stop.wait(1.0):
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning("%s still in a tick after %ss; exiting anyway", thread.name, STOP_TIMEOUT_S)
    try:
        reconciler.release()
    except Exception:
        log.exception("loops: could not release the reconciler lock; its lease will run out")
    log.info("loops stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
