"""The Procrastinate peer of bench/peers.py: one no-op task on its own Postgres database.

It runs only under the peers' virtualenv (`.venv/peers`, from
bench/requirements-peers-procrastinate.lock), never under the project's: Procrastinate needs
psycopg 3, and with psycopg 3 importable Django would switch the whole project from psycopg2 to
it. So bench/peers.py, which runs under the project's virtualenv, drives this module as
subprocesses:

    .venv/peers/bin/python -m procrastinate --app=bench.procrastinate_app.app schema --apply
    .venv/peers/bin/python -m procrastinate --app=bench.procrastinate_app.app worker ...
    .venv/peers/bin/python -m bench.procrastinate_app enqueue N   # prints one JSON line

The database is PEER_PROCRASTINATE_DATABASE_URL (set by bench/peers.py). The task is `async`,
Procrastinate's own kind: a sync task would run in a thread through `sync_to_async`, which only
costs the peer.
"""

from __future__ import annotations

import json
import os
import sys
import time

import procrastinate

QUEUE = "bench"
TASK_NAME = "bench_noop"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ["PEER_PROCRASTINATE_DATABASE_URL"],
        kwargs={"application_name": "bench-procrastinate"},
    )
)


@app.task(name=TASK_NAME, queue=QUEUE)
async def noop() -> None:
    return None


def enqueue(runs: int) -> list[float]:
    """Defer `runs` jobs one call at a time, as an application would; seconds per call."""
    latencies = []
    with app.open():
        for _ in range(runs):
            began = time.perf_counter()
            noop.defer()
            latencies.append(time.perf_counter() - began)
    return latencies


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "enqueue":
        sys.exit("usage: python -m bench.procrastinate_app enqueue N")
    print(json.dumps({"latencies": enqueue(int(sys.argv[2]))}))
