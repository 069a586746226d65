"""Bulk starts against one-by-one starts, and delayed starts' lateness (issue 27).

    .venv/bin/python bench/starts.py [--runs 10000] [--batch 500] [--delayed 300]

On the bench stores (bench/throughput.py's: its own database and Redis DBs), no worker consuming:

1. `--runs` starts of the no-op task through `start_run`, one by one (each its own transaction),
   then as many through `start_runs` in batches of `--batch`; and, for scale, as many bare
   Celery `apply_async` calls (no durable record) on the same broker. Prints starts/s of each
   and the ratios.
2. `--delayed` delayed starts, due over the next 20 s, with the worker role's loops process
   (whose leader releases them) and a worker consuming the task's queue: the lateness of each
   run's pickup (`started_at - not_before`), p50, p99 and the worst.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.throughput import (  # noqa: E402
    TASK_ID,
    fresh_redis,
    fresh_tables,
    percentile,
    setup,
    wait_until,
)


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:8.0f}/s"


def one_by_one(runs: int) -> float:
    from orchestrator.runs.start import start_run
    from orchestrator.triggers import TriggerKind

    began = time.perf_counter()
    for _ in range(runs):
        start_run(TASK_ID, None, trigger=TriggerKind.MANUAL)
    return time.perf_counter() - began


def batched(runs: int, size: int) -> float:
    from orchestrator.runs.batch import Result, start_runs
    from orchestrator.runs.batches import StartRequest

    began = time.perf_counter()
    for first in range(0, runs, size):
        outcomes = start_runs([StartRequest(TASK_ID) for _ in range(min(size, runs - first))])
        if any(o.result is not Result.STARTED for o in outcomes):
            raise RuntimeError(f"a batch start was not started: {outcomes[0]}")
    return time.perf_counter() - began


def bare(runs: int) -> float:
    from bench import bare_app

    began = time.perf_counter()
    for _ in range(runs):
        bare_app.noop.apply_async(args=[runs], queue=bare_app.QUEUE, priority=2)
    return time.perf_counter() - began


def lateness(count: int, spread_s: float) -> list[float]:
    """Seconds from each delayed run's time to its pickup, with the loops and a worker."""
    from celery import current_app
    from django.conf import settings

    from bench import workers
    from orchestrator.models import TaskHistory
    from orchestrator.routing import queue_name
    from orchestrator.runs.start import start_run
    from orchestrator.triggers import TriggerKind
    from tasks import registry

    fresh_redis()
    fresh_tables()
    queue = queue_name(registry.get()[TASK_ID], settings.CONFIG.per_task_queues)
    workers.LOG_DIR.mkdir(exist_ok=True)
    loops = workers.spawn(
        [sys.executable, "-m", "orchestrator.loops"], workers.LOG_DIR / "loops-delayed.log"
    )
    try:
        with workers.worker(
            current_app, "lumastra", "delayed", concurrency=2, loglevel="WARNING"
        ) as worker:
            workers.open_queue(current_app, worker, queue)
            for _ in range(count):
                delay = timedelta(seconds=3 + random.uniform(0, spread_s))
                start_run(TASK_ID, None, trigger=TriggerKind.MANUAL, not_before=delay)
            done = TaskHistory.objects.filter(state="completed")
            wait_until(lambda: done.count() == count, spread_s + 60, "delayed runs")
    finally:
        workers.stop(loops)
    rows = TaskHistory.objects.values_list("trigger", "started_at")
    return [
        (started - datetime.fromisoformat(trigger["notBefore"])).total_seconds()
        for trigger, started in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--delayed", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("LUMASTRA_WORKER_MODE", "enabled")
    setup()

    fresh_redis()
    fresh_tables()
    single = one_by_one(args.runs)
    fresh_redis()
    fresh_tables()
    many = batched(args.runs, args.batch)
    fresh_redis()
    celery = bare(args.runs)
    fresh_redis()
    print(f"{args.runs} starts, no worker consuming ({os.cpu_count()} CPUs)")
    print(f"  start_run one by one      {_rate(args.runs, single)}")
    print(f"  start_runs, {args.batch:>4} a batch  {_rate(args.runs, many)}")
    print(f"  bare Celery apply_async   {_rate(args.runs, celery)}")
    print(f"  batched vs one by one {single / many:.2f}x; vs bare Celery {celery / many:.2f}x")

    if args.delayed:
        late = sorted(lateness(args.delayed, 20.0))
        print(f"{args.delayed} delayed starts due over 20 s: pickup after its time")
        p50, p99 = statistics.median(late) * 1000, percentile(late, 0.99) * 1000
        print(f"  p50 {p50:6.0f} ms   p99 {p99:6.0f} ms   worst {late[-1] * 1000:6.0f} ms")
        print(f"  earliest {late[0] * 1000:6.0f} ms (negative: started before its time)")


if __name__ == "__main__":
    main()
