"""What a stage-sweep tick and the backlog cost on a big catalog.

    .venv/bin/python bench/sweep.py [--items 1000000] [--repeat 5] [--reload]

Loads the demo catalog (`load_demo_catalog`, 1,000,000 items by default, once: later runs
reuse it unless --reload) into its own database, with the demo's three covered stages
(`checksum`, `artwork`, `season-summary`: ~1.66 M rows), spreads the rows over the statuses a
library in use shows (most completed, a tenth pending, some failed, obsolete, running, skipped
for now, each due at a different moment; 1 % of the files gone since, some missing ones back),
VACUUM ANALYZE, then times:

- one tick without its enqueue (version check, self-heal, heal batch, candidates and
  dispose, wedged rows), phase by phase, in a transaction rolled back after each repeat so
  every repeat sees the same rows;
- one real tick, which also starts the runs (its enqueue, reported apart);
- the backlog's counts per stage and status and its oldest waiting rows (`backlog.overview`);

and prints `EXPLAIN (ANALYZE, BUFFERS)` of the candidate, heal and count queries. Targets
(issue 11): a tick <= 250 ms without its enqueue, the backlog <= 300 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.throughput import BENCH_ENV, prepare_stores  # noqa: E402

SWEEP_ENV = {
    **BENCH_ENV,
    "DATABASE_URL": os.environ.get(
        "BENCH_SWEEP_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lumastra_sweep_bench"
    ),
    "LUMASTRA_TASK_MODULES": "tasks.definitions.demo,tasks.definitions.catalog",
}
TICK_TARGET_MS = 250
BACKLOG_TARGET_MS = 300

# The share of a stage's eligible rows in each status, as a library in use shows them.
SPREAD = """
UPDATE media_item_stage_state SET status = 'pending' WHERE status <> 'skipped_permanent';
UPDATE media_item_stage_state SET
  status = CASE WHEN r < 0.62 THEN 'completed' WHEN r < 0.72 THEN 'pending'
                WHEN r < 0.77 THEN 'failed_transient' WHEN r < 0.79 THEN 'failed_permanent'
                WHEN r < 0.83 THEN 'obsolete' WHEN r < 0.84 THEN 'running'
                WHEN r < 0.86 THEN 'skipped_transient' ELSE 'completed' END,
  processing_version = 1,
  run_id = 'run_bench',
  started_at = now() - r * interval '5 minutes',
  next_eligible_at = now() + (due - 0.5) * interval '30 days'
FROM (SELECT id, random() AS r, random() AS due
        FROM media_item_stage_state WHERE status = 'pending') AS s
WHERE media_item_stage_state.id = s.id;
-- Files gone since their rows were judged (due ones are disposed), and files back (their
-- skipped rows heal). The triggers write outbox events; the bench does not dispatch them.
UPDATE media_files SET is_missing = true WHERE NOT is_missing AND random() < 0.01;
UPDATE media_files SET is_missing = false WHERE is_missing AND random() < 0.3;
DELETE FROM event_outbox;
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reload", action="store_true", help="load the catalog again")
    parser.add_argument("--respread", action="store_true", help="spread the statuses again")
    args = parser.parse_args(argv)
    os.chdir(Path(__file__).resolve().parent.parent)
    os.environ.update(SWEEP_ENV)
    prepare_stores(SWEEP_ENV)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from coverage.models import MediaItem, MediaItemStageState

    have = MediaItem.objects.count()
    if args.reload or abs(have - args.items) > args.items * 0.05:
        print(f"loading {args.items} items (the catalog holds {have}) ...", flush=True)
        call_command("load_demo_catalog", "--items", str(args.items), "--replace")
        args.respread = True
    if args.respread:
        with connection.cursor() as cursor:
            cursor.execute("SELECT setseed(0.42)")
            cursor.execute(SPREAD)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE media_item_stage_state")
        cursor.execute("VACUUM ANALYZE media_items")
    rows = MediaItemStageState.objects.count()
    print(f"catalog: {MediaItem.objects.count()} items, {rows} coverage rows")
    print_spread()
    warm_up()
    tick_ms = time_tick(args.repeat)
    backlog_ms = time_backlog(args.repeat)
    time_real_tick()
    time_run_triggers(args.repeat)
    explain()
    print(
        f"\ntick without enqueue: median {tick_ms:.1f} ms (target <= {TICK_TARGET_MS}) "
        f"{'MET' if tick_ms <= TICK_TARGET_MS else 'MISSED'}; backlog: median {backlog_ms:.1f} ms "
        f"(target <= {BACKLOG_TARGET_MS}) {'MET' if backlog_ms <= BACKLOG_TARGET_MS else 'MISSED'}"
    )
    return 0


def warm_up() -> None:
    """One tick without candidates, committed: the stages' rows in coverage_stage (version
    seen, watermark, heal cursor) as a running sweep keeps them, so the timed ticks are steady
    ones, and the candidates still as the spread left them."""
    from coverage.sweep import Sweep

    class Bookkeeping(Sweep):
        def _start(self, stage: Any, limit: int, report: Any) -> int:
            return 0

    Bookkeeping().tick()


def print_spread() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT stage, status, count(*) FROM media_item_stage_state GROUP BY 1, 2 ORDER BY 1, 2"
        )
        by_stage: dict[str, list[str]] = defaultdict(list)
        for stage, status, count in cursor.fetchall():
            by_stage[stage].append(f"{status} {count}")
    for stage, parts in by_stage.items():
        print(f"  {stage}: {', '.join(parts)}")


def _timed(phases: dict[str, float], name: str, body: Callable[[], Any]) -> Any:
    began = time.perf_counter()
    try:
        return body()
    finally:
        phases[name] = phases.get(name, 0.0) + (time.perf_counter() - began) * 1000


def time_tick(repeat: int) -> float:
    from django.db import transaction

    from coverage.stages import Covered
    from coverage.sweep import Sweep, TickReport

    class Timed(Sweep):
        """The sweep's own tick, each phase timed, its runs not started (enqueue excluded)."""

        def __init__(self) -> None:
            super().__init__()
            self.phases: dict[str, float] = {}

        def _version(self, stage: Covered, row: Any, report: TickReport) -> None:
            _timed(self.phases, "version", lambda: super(Timed, self)._version(stage, row, report))

        def _seed(self, stage: Covered, row: Any, report: TickReport) -> None:
            _timed(self.phases, "self-heal", lambda: super(Timed, self)._seed(stage, row, report))

        def _heal(self, stage: Covered, row: Any, report: TickReport) -> None:
            _timed(self.phases, "heal", lambda: super(Timed, self)._heal(stage, row, report))

        def _class_depth(self, resource_class: str) -> int:
            return _timed(
                self.phases, "class depth", lambda: super(Timed, self)._class_depth(resource_class)
            )

        def _start(self, stage: Covered, limit: int, report: TickReport) -> int:
            return _timed(
                self.phases,
                "candidates+dispose",
                lambda: super(Timed, self)._start(stage, limit, report),
            )

        def _start_runs(self, stage: Covered, items: list[int], report: TickReport) -> int:
            return 0

        def reclaim_wedged(self, report: TickReport) -> None:
            _timed(self.phases, "wedged", lambda: super(Timed, self).reclaim_wedged(report))

    totals: list[float] = []
    phases: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeat):
        sweep = Timed()
        began = time.perf_counter()
        with transaction.atomic():
            report = sweep.tick()
            transaction.set_rollback(True)
        totals.append((time.perf_counter() - began) * 1000)
        for name, ms in sweep.phases.items():
            phases[name].append(ms)
    print(f"\none tick without enqueue, {repeat} repeats (rolled back after each):")
    for name, values in phases.items():
        print(f"  {name:20} median {statistics.median(values):7.1f} ms")
    print(f"  {'whole tick':20} median {statistics.median(totals):7.1f} ms, max {max(totals):.1f}")
    disposed, healed = sum(report.disposed.values()), sum(report.healed.values())
    print(f"  disposed {disposed} candidates, healed {healed}")
    return statistics.median(totals)


def time_backlog(repeat: int) -> float:
    from coverage import backlog

    totals = []
    for _ in range(repeat):
        began = time.perf_counter()
        backlog.overview()
        totals.append((time.perf_counter() - began) * 1000)
    print(f"\nbacklog (counts per stage and status + oldest waiting), {repeat} repeats:")
    print(f"  median {statistics.median(totals):.1f} ms, max {max(totals):.1f} ms")
    return statistics.median(totals)


def time_real_tick() -> None:
    from django.db import transaction

    from coverage.sweep import Sweep

    began = time.perf_counter()
    with transaction.atomic():
        report = Sweep().tick()
        transaction.set_rollback(True)  # the catalog stays as loaded for the next run
    ms = (time.perf_counter() - began) * 1000
    started = sum(report.started.values())
    print(f"\none real tick (rolled back, its messages published): {ms:.0f} ms, {started} starts")
    if started:
        print(f"  about {ms / started:.2f} ms per start with its enqueue")


def time_run_triggers(repeat: int, pairs: int = 1000) -> None:
    """What the run ↔ row triggers add to every run: a run's INSERT and its terminal UPDATE
    (the engine's own statements), without and with the coverage triggers, in alternating
    blocks; a plain run's key never matches, so the triggers only test their WHEN."""
    import json
    import uuid

    from django.db import connection
    from django.utils import timezone

    from orchestrator.stores import queries

    def block(key: str) -> float:
        began = time.perf_counter()
        with connection.cursor() as cursor:
            for _ in range(pairs):
                run_id = f"run_{uuid.uuid4().hex[:26]}"
                now = timezone.now()
                cursor.execute(
                    queries.INSERT_RUN.text,
                    {
                        "id": run_id,
                        "task_id": "catalog-checksum",
                        "state": "pending",
                        "stages": "{}",
                        "trigger": json.dumps({"kind": "system", "idempotencyKey": key + run_id}),
                        "input": "{}",
                        "error": None,
                        "priority": 7,
                        "identity": run_id,
                        "processing_version": 1,
                        "now": now,
                        "finished_at": None,
                    },
                )
                cursor.execute(
                    "UPDATE task_history SET state = 'completed', finished_at = %s WHERE id = %s",
                    [now, run_id],
                )
            cursor.execute("DELETE FROM task_history WHERE task_id = 'catalog-checksum'")
        return (time.perf_counter() - began) * 1e6 / pairs

    toggles = ("coverage_run_started", "coverage_run_ended")
    timings: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeat):
        with connection.cursor() as cursor:
            for name in toggles:
                cursor.execute(f"ALTER TABLE task_history DISABLE TRIGGER {name}")
        timings["without the triggers"].append(block("plain:"))
        with connection.cursor() as cursor:
            for name in toggles:
                cursor.execute(f"ALTER TABLE task_history ENABLE TRIGGER {name}")
        timings["with them, a plain run"].append(block("plain:"))
    print(f"\na run's INSERT + terminal UPDATE, {pairs} per block, {repeat} blocks each:")
    for name, values in timings.items():
        print(f"  {name:24} median {statistics.median(values):6.0f} µs per run")


def explain() -> None:
    from django.db import connection

    from coverage import queries
    from coverage.stages import find

    stage = find("checksum")
    assert stage is not None
    from django.utils import timezone

    now = timezone.now()
    plans = {
        "candidates (checksum)": (
            queries.render("candidates", stage.stage),
            {"stage": "checksum", "now": now, "settled_before": now, "limit": 100},
        ),
        "heal batch (checksum)": (
            queries.render("heal", stage.stage),
            {"stage": "checksum", "after": 0, "reasons": ["ineligible"], "limit": 2000, "now": now},
        ),
        "backlog counts": (queries.render("backlog_counts"), {}),
    }
    for name, (query, params) in plans.items():
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query}", params)
            plan = "\n".join(f"    {row[0]}" for row in cursor.fetchall())
            cursor.execute("ROLLBACK")
        print(f"\nEXPLAIN (ANALYZE, BUFFERS) {name}:\n{plan}")


if __name__ == "__main__":
    sys.exit(main())
