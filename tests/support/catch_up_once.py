"""A replica booting: `python -m tests.support.catch_up_once <barrier-dir> <replicas>`.

Sets Django up, then waits at a barrier until every replica has (each leaves a file in the
barrier folder), so they all run the scheduler's boot catch-up at once however long each
took to boot; prints the tasks it fired and those it found fired elsewhere.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import django

BARRIER_TIMEOUT_S = 120.0


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    from orchestrator.scheduler.catchup import catch_up

    barrier, replicas = Path(sys.argv[1]), int(sys.argv[2])
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while len(list(barrier.iterdir())) < replicas:
        if time.monotonic() > deadline:
            print(f"the other replicas never reached the barrier in {barrier}", file=sys.stderr)
            return 1
        time.sleep(0.005)
    report = catch_up()
    print(json.dumps({"fired": report.fired, "elsewhere": report.elsewhere}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
