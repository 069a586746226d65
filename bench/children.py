"""What fanning out costs: N children through a stage that awaits them, against N runs started
flat.

    .venv/bin/python bench/children.py [-n 1000] [--rounds 2] [--waits 30] [--concurrency 2|io]

Each round drains, through the same kind of fresh worker, N `bench-noop` runs started flat
(`start_runs`, in batches of 1,000) and one `bench-fan-out` run whose `scan` stage spawns N
`bench-noop` children and whose `collect` stage awaits them (`await_children=True`). Each side's
rate is N over the time from the first start to the last run's end (the fan-out's from its own
start, so its scan, the children's admission and their INSERT are counted).

Then `--waits` fan-outs of 20 children each, one after another, give the delay from the last
child's end to the waiting stage's start (its step record's `started_at`): the leader's
`batches` loop (run here as `orchestrator.loops` runs it: woken by the trigger's notification,
and looking every LUMASTRA_DUE_POLL_S besides) finds the done batch, the parent's advance
publishes the stage, a worker claims it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

# Run as a script, so the project root is not on the path by itself.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.throughput import (  # noqa: E402
    TERMINAL,
    fresh_redis,
    fresh_tables,
    load_average,
    percentile,
    pool_concurrency,
    setup,
    wait_until,
)

WAIT_CHILDREN = 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--children", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--waits", type=int, default=30)
    parser.add_argument("--concurrency", default="2", help="worker processes, or 'io'")
    parser.add_argument("--loglevel", default="WARNING")
    args = parser.parse_args(argv)
    setup()
    args.concurrency = pool_concurrency(args.concurrency)
    from django.conf import settings

    print(
        f"N={args.children} children, concurrency={args.concurrency}, "
        f"batches loop every {settings.CONFIG.due_poll_s} s"
    )
    ratios = []
    for round_no in range(args.rounds):
        print(f"round {round_no + 1}  (load {load_average()})")
        flat = _side(args, fan_out=False)
        spawned = _side(args, fan_out=True)
        ratios.append(spawned / flat)
        print(f"  flat starts        {flat:7.0f} runs/s")
        print(f"  children, awaited  {spawned:7.0f} runs/s = {spawned / flat:.2f}x flat")
    print(f"median: children run at {statistics.median(ratios):.2f}x flat starts")
    delays = _delays(args)
    print(
        f"last child's end -> waiting stage's start over {len(delays)} fan-outs: "
        f"p50 {percentile(delays, 0.5) * 1000:.0f} ms, p99 {percentile(delays, 0.99) * 1000:.0f} ms"
    )
    return 0


def _side(args: argparse.Namespace, *, fan_out: bool) -> float:
    """One side's rate: N runs over the time from the first start to the last run's end."""
    from django.db.models import Max

    from orchestrator.models import TaskHistory
    from orchestrator.runs.batch import start_runs
    from orchestrator.runs.batches import StartRequest
    from orchestrator.runs.start import start_run
    from orchestrator.triggers import TriggerKind

    fresh_redis()
    fresh_tables()
    runs = TaskHistory.objects.filter(task_id="bench-noop", state__in=TERMINAL)
    with _working(args):
        began = time.time()
        if fan_out:
            start_run("bench-fan-out", {"count": args.children}, trigger=TriggerKind.MANUAL)
        else:
            for first in range(0, args.children, 1000):
                size = min(1000, args.children - first)
                start_runs([StartRequest("bench-noop", {})] * size)
        wait_until(lambda: runs.count() >= args.children, 120 + args.children / 20, "the runs")
    last = runs.aggregate(last=Max("finished_at"))["last"].timestamp()
    return float(args.children / (last - began))


def _delays(args: argparse.Namespace) -> list[float]:
    from django.db.models import Max

    from orchestrator.models import TaskHistory
    from orchestrator.runs.start import start_run
    from orchestrator.triggers import TriggerKind

    fresh_redis()
    fresh_tables()
    delays = []
    with _working(args):
        for _ in range(args.waits):
            handle = start_run(
                "bench-fan-out", {"count": WAIT_CHILDREN}, trigger=TriggerKind.MANUAL
            )
            parent = TaskHistory.objects.filter(id=handle.run_id, state__in=TERMINAL)
            wait_until(parent.exists, 60, "the fan-out's end")
            started = parent.get().steps["collect"]["started_at"]
            children = TaskHistory.objects.filter(parent_run_id=handle.run_id)
            last_child = children.aggregate(last=Max("finished_at"))["last"]
            delays.append(datetime.fromisoformat(started).timestamp() - last_child.timestamp())
    return delays


@contextmanager
def _working(args: argparse.Namespace) -> Iterator[None]:
    """A fresh worker consuming both tasks' queues, and the leader's `batches` loop beside it."""
    from celery import current_app
    from django.conf import settings
    from django.db import connections

    from bench import workers
    from orchestrator.routing import queue_name
    from orchestrator.runs import children
    from tasks import registry

    per_task = settings.CONFIG.per_task_queues
    queues = {
        queue_name(registry.get()[task], per_task) for task in ("bench-noop", "bench-fan-out")
    }
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.is_set():
                children.release_when_done(wait_s=settings.CONFIG.due_poll_s)
        finally:
            connections.close_all()

    with workers.worker(
        current_app, "lumastra", "lumastra", concurrency=args.concurrency, loglevel=args.loglevel
    ) as worker:
        for queue in sorted(queues):
            workers.open_queue(current_app, worker, queue)
        looping = threading.Thread(target=loop, daemon=True)
        looping.start()
        try:
            yield
        finally:
            stop.set()
            looping.join(5)


if __name__ == "__main__":
    sys.exit(main())
