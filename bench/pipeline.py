"""What a pipeline stage costs: a four-stage no-op pipeline against single no-op runs.

    .venv/bin/python bench/pipeline.py [-n 500] [--rounds 2] [--concurrency 2|io]

Each round drains 4·N single no-op runs (`bench-noop`) and N four-stage pipeline runs
(`bench-pipe4`: a → b → c → d, each stage a no-op), so both sides run about as many handlers
and warm up alike, through the same kind of fresh worker,
the way `bench/throughput.py` drains its Lumastra side (enqueue all, then open the queue; the
span is first to last `finished_at`). It prints both rates, the pipeline's stages per second,
and the cost of one stage as a multiple of one single run (1.0: a stage costs what a run
costs). A stage is a run's work plus the advance: its claim and end are guarded UPDATEs like a
run's, and its end decides and publishes the next stage.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# Run as a script, so the project root is not on the path by itself.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.throughput import load_average, lumastra_side, pool_concurrency, setup  # noqa: E402

STAGES = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="2", help="worker processes, or 'io'")
    parser.add_argument("--loglevel", default="WARNING")
    args = parser.parse_args(argv)
    setup()
    args.concurrency = pool_concurrency(args.concurrency)
    print(
        f"N={args.runs} pipeline runs, {args.runs * STAGES} single runs, "
        f"concurrency={args.concurrency}, {STAGES}-stage chain"
    )
    per_stage = []
    for round_no in range(args.rounds):
        print(f"round {round_no + 1}  (load {load_average()})")
        single = lumastra_side(args.runs * STAGES, args)
        pipe = lumastra_side(args.runs, args, task_id="bench-pipe4")
        stage_cost = (1 / (pipe.rate * STAGES)) / (1 / single.rate)
        per_stage.append(stage_cost)
        print(f"  single no-op runs   {single.rate:7.0f} runs/s")
        print(f"  4-stage pipelines   {pipe.rate:7.0f} runs/s = {pipe.rate * STAGES:.0f} stages/s")
        print(f"  one stage costs {stage_cost:.2f}x one single run")
    print(f"median: one stage costs {statistics.median(per_stage):.2f}x one single run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
