"""What history-retention costs at 1M ended runs, with tasks declaring their own retention.

    .venv/bin/python bench/retention.py [--runs 1000000] [--batch 1000] [--explain]

Loads, into its own database (`BENCH_RETENTION_DATABASE_URL`, by default
`lumastra_bench_retention`), `--runs` ended runs over the last 60 days across 20 tasks
(`bench/sql/retention_history.sql`, one INSERT … SELECT from generate_series, the row triggers
off) with three state changes each (`bench/sql/console_audit.sql`), then VACUUM ANALYZE. The
load is repeated on every invocation: a pass deletes what it measures.

The tasks' retention (`RETENTION`) mixes what declarations look like: none (the global 30
days), completed runs kept a day and failed ones two weeks, completed a week with failed at the
global, an hour with the last 1,000 kept, and 90 days with the last 20,000 kept (longer than the
global: the walk passes over rows it keeps). Two tasks run rarely, so `keep_last` holds runs far
older than their cutoffs.

Then one `prune_history` pass, as the `history-retention` task calls it, prints rows deleted,
batches, total time and the longest single batch of each table (one batch is one statement in
its own transaction: its time is the longest any row lock of the pass is held), and checks the
result against the declarations: no run left that the cutoffs taken before the pass condemn, and
every `keep_last` task still holding its newest runs. `--explain` prints the plans of one batch
and of the kept-runs lookup (`EXPLAIN (ANALYZE, BUFFERS)`, rolled back).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.database import own_database  # noqa: E402
from bench.throughput import BENCH_ENV  # noqa: E402
from orchestrator import sql  # noqa: E402
from tasks.retention import Retention  # noqa: E402

RETENTION_ENV = {
    **BENCH_ENV,
    "DATABASE_URL": os.environ.get(
        "BENCH_RETENTION_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/lumastra_bench_retention",
    ),
}
DAY_S = 86400
GLOBAL_S = 30 * DAY_S
# Task ids by declaration; `None`: no `retention=`, the global retention.
RETENTION: dict[str, Retention | None] = {
    **{f"bench-default-{n}": None for n in range(6)},
    **{f"bench-day-{n}": Retention(completed_s=DAY_S, failed_s=14 * DAY_S) for n in range(5)},
    **{f"bench-week-{n}": Retention(completed_s=7 * DAY_S) for n in range(5)},
    **{f"bench-keep-{n}": Retention(completed_s=3600, keep_last=1000) for n in range(2)},
    **{f"bench-long-{n}": Retention(completed_s=90 * DAY_S, keep_last=20_000) for n in range(2)},
}
# How often each task runs against the others (weights); the rest run at 10.
WEIGHTS = {"bench-keep-1": 1, "bench-long-1": 1}
LOAD = [sql.load(__file__, name) for name in ("retention_history", "console_audit")]
TABLES = {
    "prune_runs": "runs (task_history, with their audit)",
    "prune_audit": "state changes left (task_history_audit)",
    "prune_batches": "batches of runs (run_batches)",
    "prune_webhook_deliveries": "webhook deliveries",
    "prune_notifications": "notifications",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--explain", action="store_true", help="plans of a batch and the lookup")
    args = parser.parse_args(argv)
    own_database(RETENTION_ENV)
    from django.conf import settings

    settings.CONFIG = dataclasses.replace(
        settings.CONFIG, history_retention_s=GLOBAL_S, retention_batch=args.batch
    )
    own = {task: r for task, r in RETENTION.items() if r is not None}
    load(args.runs)
    if args.explain:
        explain(own)
    before = counts_by_task()
    condemned = condemned_params(own)
    timings, pruned = timed_pass(own)
    print_pass(timings, pruned)
    return check(before, condemned, own)


def load(runs: int) -> None:
    from django.db import connection

    tasks = [t for t in RETENTION for _ in range(WEIGHTS.get(t, 10))]
    print(f"loading {runs} ended runs over {len(RETENTION)} tasks ...", flush=True)
    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE task_history, task_history_audit, run_event_outbox")
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute("SET session_replication_role = replica")
        for statement in LOAD:
            cursor.execute(statement, {"n": runs, "tasks": tasks})
        cursor.execute("SET session_replication_role = DEFAULT")
        cursor.execute("VACUUM ANALYZE task_history")
        cursor.execute("VACUUM ANALYZE task_history_audit")
        cursor.execute("SELECT count(*) FROM task_history_audit")
        (audit,) = cursor.fetchone()
    print(f"  loaded in {time.monotonic() - began:.0f} s, with {audit} state changes")


def counts_by_task() -> dict[str, int]:
    from django.db.models import Count

    from orchestrator.models import TaskHistory

    rows = TaskHistory.objects.values_list("task_id").annotate(n=Count("id"))
    return dict(rows)


def condemned_params(own: dict[str, Retention]) -> dict[str, Any]:
    """prune_runs.sql's cutoffs, taken before the pass: every run they condemn must be gone
    after it (the pass's own, taken a moment later, condemn at least those)."""
    from orchestrator.stores.retention import runs_params, seconds_ago

    keep_last = [own[task].keep_last for task in sorted(own)]
    return {**runs_params(seconds_ago(GLOBAL_S), own), "keep_last": keep_last}


@contextmanager
def statement_times(into: dict[str, list[float]]) -> Iterator[None]:
    """Each prune statement's wall time, by its file: one batch, one transaction, each."""
    from django.db import connection

    from orchestrator.stores import retention

    names = {getattr(retention, name.upper()): name for name in (*TABLES, "prune_runs_kept")}

    def timed(execute: Callable[..., Any], text: str, params: Any, many: bool, ctx: Any) -> Any:
        began = time.perf_counter()
        try:
            return execute(text, params, many, ctx)
        finally:
            if text in names:
                into[names[text]].append((time.perf_counter() - began) * 1000)

    with connection.execute_wrapper(timed):
        yield


def timed_pass(own: dict[str, Retention]) -> tuple[dict[str, list[float]], Any]:
    from orchestrator.stores.retention import prune_history

    timings: dict[str, list[float]] = defaultdict(list)
    began = time.perf_counter()
    with statement_times(timings):
        pruned = prune_history(retention=own)
    timings["total"] = [(time.perf_counter() - began) * 1000]
    return timings, pruned


def print_pass(timings: dict[str, list[float]], pruned: Any) -> None:
    deleted = {
        "prune_runs": pruned.runs,
        "prune_audit": pruned.audit,
        "prune_batches": pruned.batches,
        "prune_webhook_deliveries": pruned.webhook_deliveries,
        "prune_notifications": pruned.notifications,
    }
    print(f"\n{'table':42} {'deleted':>9} {'batches':>8} {'total ms':>10} {'longest ms':>11}")
    for name, label in TABLES.items():
        times = timings.get(name, [])
        print(
            f"{label:42} {deleted[name]:>9} {len(times):>8} {sum(times):>10.0f} "
            f"{max(times, default=0):>11.1f}"
        )
    kept = timings.get("prune_runs_kept", [])
    print(
        f"{'keep_last boundaries (a read per task)':42} {'':>9} {len(kept):>8} {sum(kept):>10.0f}"
    )
    batches = [t for name in TABLES for t in timings.get(name, [])]
    print(
        f"\npass: {timings['total'][0] / 1000:.1f} s, {len(batches)} batches, the longest "
        f"{max(batches):.1f} ms, median {sorted(batches)[len(batches) // 2]:.1f} ms"
    )


def check(before: dict[str, int], condemned: dict[str, Any], own: dict[str, Retention]) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql.load(__file__, "retention_left"), condemned)
        (left,) = cursor.fetchone()
    after = counts_by_task()
    short = [
        task
        for task, declared in own.items()
        if declared.keep_last and after.get(task, 0) < min(declared.keep_last, before[task])
    ]
    print(f"runs left that the cutoffs taken before the pass condemn: {left} (must be 0)")
    for task in sorted(RETENTION):
        print(f"  {task:18} {before.get(task, 0):>7} → {after.get(task, 0):>7}")
    if short:
        print(f"keep_last not honoured for: {', '.join(short)}")
    return 1 if left or short else 0


def explain(own: dict[str, Retention]) -> None:
    from django.db import connection, transaction

    from orchestrator.stores.retention import (
        FIRST_MOMENT,
        PRUNE_RUNS,
        PRUNE_RUNS_KEPT,
        TERMINAL,
        runs_params,
        seconds_ago,
    )

    params = runs_params(seconds_ago(GLOBAL_S), own)
    rare = {"task": "bench-keep-1", "keep_last": 1000, "terminal": TERMINAL}
    for title, text, values in (
        (
            "one batch of prune_runs.sql",
            PRUNE_RUNS,
            {**params, "after": FIRST_MOMENT, "batch": 1000},
        ),
        ("prune_runs_kept.sql, a rare task", PRUNE_RUNS_KEPT, rare),
    ):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, values)
            print(f"\n{title}:")
            print("\n".join(f"  {line}" for (line,) in cursor.fetchall()))
            transaction.set_rollback(True)


if __name__ == "__main__":
    sys.exit(main())
