"""What a start policy adds to start_run (issue 39): a debounce, a throttle and a keyed
concurrency against a plain start of the same input, p50, in one run.

Same process, same stores (the bench database and Redis DBs of bench/throughput.py), no
worker: the messages simply wait. Blocks of starts rotate over the variants so any drift of the
machine's load falls on all of them. Every start names a new key, so each is the first of its
identity (a debounce's first start records its run; a throttle's takes its period; a keyed
start registers its run and, its key free, publishes it); a debounce's later start of a waiting
identity ("debounce, joining") is one UPDATE and measured on its own.

Usage: .venv/bin/python bench/coalescing.py [-n 2000] [--block 100]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

from bench.throughput import (  # noqa: E402
    fresh_redis,
    fresh_tables,
    load_average,
    percentile,
    setup,
)

PLAIN = "plain"
VARIANTS = {
    PLAIN: "bench-keyed-plain",
    "debounce, first start": "bench-keyed-debounced",
    "debounce, joining": "bench-keyed-debounced",
    "throttle": "bench-keyed-throttled",
    "keyed concurrency": "bench-keyed-limited",
}
JOINING = "debounce, joining"


def measure(runs: int, block: int) -> dict[str, list[float]]:
    """start_run latencies (ms) per variant, `runs` of each, rotating in blocks."""
    from orchestrator.runs.start import start_run
    from orchestrator.triggers import TriggerKind

    fresh_redis()
    fresh_tables()
    keys = (f"k{n}" for n in itertools.count())
    start_run(VARIANTS[JOINING], {"key": "joined"}, trigger=TriggerKind.EVENT)
    timings: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(runs // block):
        for name, task_id in VARIANTS.items():
            for _ in range(block):
                key = "joined" if name == JOINING else next(keys)
                began = time.perf_counter()
                start_run(task_id, {"key": key}, trigger=TriggerKind.EVENT)
                timings[name].append((time.perf_counter() - began) * 1000)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--runs", type=int, default=2000, help="starts per variant")
    parser.add_argument("--block", type=int, default=100, help="starts per rotating block")
    args = parser.parse_args(argv)
    setup()
    timings = measure(args.runs, args.block)
    plain = percentile(timings[PLAIN], 0.5)
    print(f"start_run latency, N={args.runs} per variant, blocks of {args.block}")
    print(f"load {load_average()}")
    for name, values in timings.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        added = "" if name == PLAIN else f"  adds {p50 - plain:+.2f} ms at p50"
        print(f"  {name:22} p50 {p50:.2f} ms  p99 {p99:.2f} ms{added}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
