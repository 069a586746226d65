"""Resident memory of every process of the worker role, idle and after real work.

    .venv/bin/python bench/memory.py [-n 1000] [--pool io]

Starts the worker role as deployed (`python -m lumastra.workers`: one prefork Celery worker
per pool, plus the orchestrator loops process) on the benchmark's own stores (bench/throughput.py:
its database and Redis DBs, emptied first), measures every process of it once the pools
answer a ping, then starts `n` no-op runs per process of `--pool` (so each of its children
runs about `n`) and measures again once every run is terminal.

For each process: RSS (what the issue's 150 MB target is about), PSS (RSS with pages shared
between processes divided among them: prefork children share their parent's pages
copy-on-write, so RSS counts those pages once per child and PSS does not) and peak RSS
(VmHWM). A child's runs are counted from `task_history.owner_instance_id`, which carries the
claiming process's pid. Children are not recycled during the measurement (the role's
LUMASTRA_WORKER_MAX_TASKS_PER_CHILD, off by default, is set above `n` in case the environment
set one), so each child measured is the one that did its runs.

It stops only the role it started (its own process group).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

from bench.throughput import (  # noqa: E402
    TASK_ID,
    TERMINAL,
    fresh_redis,
    fresh_tables,
    load_average,
    setup,
    wait_until,
)
from bench.workers import LOG_DIR, stop  # noqa: E402

MB = 1024 * 1024


@dataclass(frozen=True)
class Process:
    pid: int
    role: str  # "supervisor", "<pool> main", "<pool> child", "loops"
    rss: int  # bytes
    pss: int
    peak_rss: int


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        found = []
        for task in tasks:
            found += [int(c) for c in (task / "children").read_text().split()]
        return found
    except (FileNotFoundError, ProcessLookupError):
        return []


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def _role(pid: int, parent_role: str) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [a.decode() for a in argv if a]
    if "orchestrator.loops" in words:
        return "loops"
    if parent_role.endswith(" main"):  # forked: a child keeps its parent's argv
        return parent_role.replace(" main", " child")
    if "-n" in words:
        return f"{words[words.index('-n') + 1].split('@')[0]} main"
    return f"{parent_role} child"


def snapshot(supervisor: int) -> list[Process]:
    """Every process of the role: the supervisor, each pool's main and children, the loops."""
    found = []
    pending = [(supervisor, "")]
    while pending:
        pid, parent_role = pending.pop(0)
        try:
            role = "supervisor" if pid == supervisor else _role(pid, parent_role)
            found.append(
                Process(pid, role, _status_kb(pid, "VmRSS"), _pss(pid), _status_kb(pid, "VmHWM"))
            )
        except (FileNotFoundError, ProcessLookupError):
            continue
        pending += [(child, role) for child in _children(pid)]
    return found


def runs_by_pid() -> dict[int, int]:
    from django.db.models import Count

    from orchestrator.models import TaskHistory

    counts: dict[int, int] = {}
    rows = TaskHistory.objects.values("owner_instance_id").annotate(n=Count("id"))
    for row in rows:
        # instance ids are host:pid:suffix (orchestrator.cluster.instance)
        parts = str(row["owner_instance_id"]).split(":")
        if len(parts) == 3 and parts[1].isdigit():
            counts[int(parts[1])] = counts.get(int(parts[1]), 0) + row["n"]
    return counts


def table(before: list[Process], after: list[Process], runs: dict[int, int]) -> str:
    idle = {p.pid: p for p in before}
    lines = [
        "| process | pid | runs | RSS idle | RSS after | PSS after | peak RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in sorted(after, key=lambda p: (p.role, p.pid)):
        start = f"{idle[p.pid].rss / MB:.0f} MB" if p.pid in idle else "(new)"
        lines.append(
            f"| {p.role} | {p.pid} | {runs.get(p.pid, '')} | {start} | {p.rss / MB:.0f} MB"
            f" | {p.pss / MB:.0f} MB | {p.peak_rss / MB:.0f} MB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--runs", type=int, default=1000, help="runs per pool process")
    parser.add_argument("--pool", default="io", help="the pool the runs go to")
    args = parser.parse_args(argv)
    setup()
    from celery import current_app

    from lumastra import workers
    from orchestrator.models import TaskHistory
    from orchestrator.runs.start import start_run
    from orchestrator.triggers import TriggerKind

    fresh_redis()
    fresh_tables()
    pools = {pool.name: pool for pool in workers.plan()}
    total = args.runs * pools[args.pool].concurrency
    LOG_DIR.mkdir(exist_ok=True)
    log_path = LOG_DIR / "worker-role.log"
    host = socket.gethostname()
    # Children are recycled after LUMASTRA_WORKER_MAX_TASKS_PER_CHILD runs when it is set (off
    # by default): set above n here so the children measured are the ones that did the runs.
    env = {**os.environ, "LUMASTRA_WORKER_MAX_TASKS_PER_CHILD": str(2 * args.runs + 100)}
    with log_path.open("wb") as log:
        role = subprocess.Popen(
            [sys.executable, "-m", "lumastra.workers", "--without-mingle", "--without-gossip"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        nodes = [f"{name}@{host}" for name in pools]
        wait_until(
            lambda: len(current_app.control.ping(destination=nodes, timeout=0.5)) == len(nodes),
            60,
            f"the pools {', '.join(nodes)} to answer (see {log_path})",
        )
        time.sleep(2)  # the loops process's first ticks
        before = snapshot(role.pid)
        print(f"{total} runs of {TASK_ID} to the {args.pool} pool; load {load_average()}")
        for _ in range(total):
            start_run(TASK_ID, None, trigger=TriggerKind.MANUAL)
        terminal = TaskHistory.objects.filter(state__in=TERMINAL)
        wait_until(lambda: terminal.count() >= total, 120 + total / 20, f"{total} runs")
        after = snapshot(role.pid)
    finally:
        stop(role)
    print(table(before, after, runs_by_pid()))
    pool_processes = [p for p in after if p.role.endswith((" main", " child"))]
    worst = max(pool_processes, key=lambda p: p.rss)
    print(f"largest pool process: {worst.role} {worst.pid}, RSS {worst.rss / MB:.0f} MB")
    print(f"load {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
