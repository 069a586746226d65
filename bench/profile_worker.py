"""`celery <args>` with cProfile on the worker's main process only.

Usage: python bench/profile_worker.py OUT.prof -A app worker ...

For no-op work the prefork main process (receive, hand to the pool, ack) is the bottleneck,
so that is the process worth profiling. The profiler counts CPU time, not wall time, so the
time the worker spends idle waiting for the benchmark to open its queue is not charged to
any function; it starts once the worker is ready, so startup is left out too. A pool
child forked while it runs switches it off, so children run at full speed and stay out of OUT.
"""

from __future__ import annotations

import cProfile
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, so the project root is not on the path by itself.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from celery.bin.celery import main as celery_main  # noqa: E402
from celery.signals import worker_process_init, worker_ready  # noqa: E402

profiler = cProfile.Profile(time.process_time)


@worker_ready.connect
def _start(**_: Any) -> None:
    profiler.enable()


@worker_process_init.connect
def _not_in_children(**_: Any) -> None:
    profiler.disable()


def main() -> None:
    out = sys.argv[1]
    sys.argv = ["celery", *sys.argv[2:]]
    try:
        celery_main()
    except SystemExit:
        pass
    finally:
        profiler.disable()
        profiler.dump_stats(out)


if __name__ == "__main__":
    main()
