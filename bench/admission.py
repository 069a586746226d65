"""What admission adds to start_run: its latency with every hook, and with none, in one run.

Same process, same stores (the bench database and Redis DBs of bench/throughput.py), no
worker: the messages simply wait. Blocks of starts alternate between the two variants so any
drift of the machine's load falls on both. The variant without admission swaps the hook list
for an empty one in this process only, which is what start_run would cost had issue 3 never
landed (dedup, circuit, quota and backpressure checks all skipped).

Usage: .venv/bin/python bench/admission.py [-n 2000] [--block 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

from bench.throughput import (  # noqa: E402
    TASK_ID,
    fresh_redis,
    fresh_tables,
    load_average,
    percentile,
    setup,
)

WITH, WITHOUT = "with admission", "without admission"


def measure(runs: int, block: int) -> dict[str, list[float]]:
    """start_run latencies (ms) with every hook and with none, `runs` of each, alternating in
    blocks. Needs Django set up on the bench stores; empties them first and leaves the
    messages waiting."""
    from orchestrator.hooks import dispatch
    from orchestrator.runs.start import start_run
    from orchestrator.triggers import TriggerKind

    fresh_redis()
    fresh_tables()
    every_hook = dispatch.installed()
    timings: dict[str, list[float]] = {WITH: [], WITHOUT: []}
    try:
        for _ in range(runs // block):
            for name, hooks in ((WITH, every_hook), (WITHOUT, ())):
                dispatch.install(hooks)
                for _ in range(block):
                    began = time.perf_counter()
                    start_run(TASK_ID, {}, trigger=TriggerKind.MANUAL)
                    timings[name].append((time.perf_counter() - began) * 1000)
    finally:
        dispatch.install(every_hook)
    return timings


def added_p50(timings: dict[str, list[float]]) -> float:
    """What admission adds to start_run at p50, in ms."""
    return percentile(timings[WITH], 0.5) - percentile(timings[WITHOUT], 0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--runs", type=int, default=2000, help="starts per variant")
    parser.add_argument("--block", type=int, default=100, help="starts per alternating block")
    args = parser.parse_args(argv)
    setup()
    timings = measure(args.runs, args.block)
    print(f"start_run latency, N={args.runs} per variant, blocks of {args.block}")
    print(f"load {load_average()}")
    for name, values in timings.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        print(f"  {name:18} p50 {p50:.2f} ms  p99 {p99:.2f} ms")
    print(f"  admission adds {added_p50(timings):.2f} ms at p50")
    return 0


if __name__ == "__main__":
    sys.exit(main())
