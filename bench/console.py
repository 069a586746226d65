"""How fast the operator console's pages render with a big history and a big catalog.

    .venv/bin/python bench/console.py [--runs 1000000] [--items 1000000] [--repeat 5]
                                      [--reload-runs] [--reload-items] [--explain] [--only TEXT]

Loads, into its own database (`BENCH_CONSOLE_DATABASE_URL`, by default `lumastra_console_bench`;
later invocations reuse what is there unless told to reload):

- **1,000,000 runs** in `task_history` over the last 60 days (`bench/sql/console_history.sql`, one
  INSERT … SELECT from generate_series, the row triggers off, their audit rows written apart,
  their daily counts in `task_quota_usage` as the engine would have kept them):
  tasks from the registry, mostly completed (85 %) and failed (12.5 %), some cancelled, the
  newest few thousand partly pending, active or cancelling; every trigger kind with its
  priority; errors of each kind, a third of the failed ones dead letters (`exhausted: true`);
  some with progress, step records and cost;
- **the demo catalog at 1,000,000 items** with its coverage rows spread as a library in use
  shows them, loaded and spread exactly as `bench/sweep.py` does (`load_demo_catalog`, SPREAD);

then VACUUM ANALYZE, and renders each page of `PAGES` through Django's test client (in this
process: the view, its queries and its template; no HTTP server, no network, no static files),
logged in as a superuser: one warm-up load, then `--repeat` loads, and prints the median, the
slowest and the number of queries of each page against the target (300 ms, issue 13).
`--explain` prints `EXPLAIN (ANALYZE, BUFFERS)` of each page's slowest queries.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.sweep import SPREAD, SWEEP_ENV, print_spread  # noqa: E402
from bench.throughput import prepare_stores  # noqa: E402
from orchestrator import sql  # noqa: E402

CONSOLE_ENV = {
    **SWEEP_ENV,
    "DATABASE_URL": os.environ.get(
        "BENCH_CONSOLE_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lumastra_console_bench"
    ),
}
TARGET_MS = 300
# The load, in order: the runs, the retries among them, their audit rows, their daily counts.
HISTORY_SQL = [
    sql.load(__file__, name)
    for name in ("console_history", "console_retries", "console_audit", "console_quota_usage")
]
# The queries --explain plans: reads, after any comment lines of a named query.
_READ = re.compile(r"\s*(--[^\n]*\n\s*)*\(*\s*(SELECT|WITH)\b", re.IGNORECASE)

RUNS = "/admin/orchestrator/taskhistory/"
OVERVIEW_PANELS = ("minutes", "days", "waiting", "failing", "workers")
ROWS = "/admin/coverage/mediaitemstagestate/"
# The pages timed, one line each: (label, URL). `{run}` is a finished run with steps and
# progress, `{dead}` a dead letter, `{retried}` a failed run an operator retried, `{item}` a
# catalog item with coverage rows, `{week_ago}` the date seven days ago.
PAGES: list[tuple[str, str]] = [
    ("runs", RUNS),
    ("runs: state failed", RUNS + "?state__exact=failed"),
    ("runs: state pending", RUNS + "?state__exact=pending"),
    ("runs: task", RUNS + "?task=catalog-artwork"),
    ("runs: trigger kind api", RUNS + "?trigger=api"),
    ("runs: priority 1", RUNS + "?priority=1"),
    ("runs: dead letters", RUNS + "?outcome=dead-letter"),
    ("runs: state + task + kind", RUNS + "?state__exact=failed&task=epg-refresh&trigger=schedule"),
    ("runs: search run id", RUNS + "?q={run}"),
    ("runs: page 200", RUNS + "?p=200"),
    ("runs: class cpu", RUNS + "?class=cpu"),
    ("runs: created last 7 days", RUNS + "?created_at__gte={week_ago}"),
    ("run detail", RUNS + "{run}/change/"),
    ("run detail: dead letter", RUNS + "{dead}/change/"),
    ("run detail: retried", RUNS + "{retried}/change/"),
    ("start a run", RUNS + "start/"),
    ("tasks", RUNS + "tasks/"),
    ("nodes", RUNS + "nodes/"),
    ("dead letters", RUNS + "dead-letters/"),
    ("schedules", RUNS + "schedules/"),
    ("coverage backlog", ROWS + "backlog/"),
    ("item-stage rows", ROWS),
    ("item-stage rows: stage + status", ROWS + "?stage=checksum&status=failed_permanent"),
    ("item-stage rows: status", ROWS + "?status__exact=pending"),
    ("item-stage rows: an item", ROWS + "?item__id__exact={item}"),
    ("media items", "/admin/coverage/mediaitem/"),
    ("media items: kind", "/admin/coverage/mediaitem/?kind__exact=episode"),
    ("media item detail", "/admin/coverage/mediaitem/{item}/change/"),
    ("media files", "/admin/coverage/mediafile/"),
    ("media files: missing", "/admin/coverage/mediafile/?is_missing__exact=1"),
    ("file links", "/admin/coverage/mediafileitem/"),
    ("external ids", "/admin/coverage/externalid/"),
    ("external ids: provider", "/admin/coverage/externalid/?provider=tmdb"),
    ("outbox events", "/admin/coverage/eventoutbox/"),
    # The first page (the admin's index) with every panel, then each panel as its page
    # fetches it again.
    ("overview", "/admin/"),
    *((f"overview: {panel}", f"/admin/overview/{panel}/") for panel in OVERVIEW_PANELS),
]

# How often each trigger kind, task and error kind shows up in the loaded history (weights).
KIND_WEIGHTS = {
    "schedule": 35,
    "event": 30,
    "pipeline": 8,
    "system": 12,
    "api": 8,
    "admin": 3,
    "manual": 3,
    "operator-retry": 1,
}
ERROR_WEIGHTS = {
    "transient": 50,
    "permanent": 12,
    "timeout": 10,
    "internal": 10,
    "orphaned": 5,
    "fatal": 5,
    "validation": 4,
    "stalled": 2,
    "dropped": 2,
}
LIVE_RUNS = 5_000  # the newest runs, of which some are still pending, active or cancelling


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reload-runs", action="store_true", help="load the history again")
    parser.add_argument("--reload-items", action="store_true", help="load the catalog again")
    parser.add_argument("--respread", action="store_true", help="spread the coverage rows again")
    parser.add_argument("--explain", action="store_true", help="plans of the slowest queries")
    parser.add_argument("--only", default="", help="time only the pages whose label has this")
    args = parser.parse_args(argv)
    os.chdir(Path(__file__).resolve().parent.parent)
    os.environ.update(CONSOLE_ENV)
    from lumastra import preflight

    problem = preflight.check_postgres(CONSOLE_ENV["DATABASE_URL"], create=True)
    if problem:
        sys.exit(problem)
    # Migrated before prepare_stores does: on a fresh database `migrate`'s database checks
    # would plan the stages' conditions over tables it has not made yet.
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0", "--skip-checks"],
        check=True,
    )
    prepare_stores(CONSOLE_ENV)
    import django

    django.setup()

    load_catalog(args.items, args.reload_items, args.respread)
    load_history(args.runs, args.reload_runs)
    pages = [(label, url) for label, url in PAGES if args.only in label]
    timings = time_pages(pages, args.repeat, args.explain)
    print_table(timings)
    missed = [t.label for t in timings if not t.met]
    met = len(timings) - len(missed)
    print(f"\n{met} of {len(timings)} pages answered 200 within {TARGET_MS} ms", end="")
    print(f"; not: {', '.join(missed)}" if missed else "")
    return 1 if missed else 0


def load_catalog(items: int, reload: bool, respread: bool) -> None:
    """The catalog and its coverage rows as bench/sweep.py loads and spreads them."""
    from django.core.management import call_command
    from django.db import connection

    from coverage.models import MediaItem

    have = MediaItem.objects.count()
    if reload or abs(have - items) > items * 0.05:
        print(f"loading {items} items (the catalog holds {have}) ...", flush=True)
        call_command("load_demo_catalog", "--items", str(items), "--replace")
        respread = True
    if respread:
        with connection.cursor() as cursor:
            cursor.execute("SELECT setseed(0.42)")
            cursor.execute(SPREAD)
            for table in ("media_item_stage_state", "media_items", "media_files"):
                cursor.execute(f"VACUUM ANALYZE {table}")
        print_spread()


def load_history(runs: int, reload: bool) -> None:
    from django.db import connection

    from orchestrator.models import TaskHistory
    from orchestrator.triggers import PRIORITY_BY_TRIGGER
    from tasks import registry

    have = TaskHistory.objects.count()
    if not reload and abs(have - runs) <= runs * 0.05:
        print(f"task_history: {have} runs (loaded before)")
        return
    print(f"loading {runs} runs (task_history holds {have}) ...", flush=True)
    # The catalog's per-item tasks run far more often than the upkeep ones.
    weights = {"catalog-checksum": 30, "catalog-artwork": 25, "catalog-season-summary": 10}
    tasks = [t for task_id in sorted(registry.get()) for t in [task_id] * weights.get(task_id, 5)]
    params: dict[str, Any] = {
        "n": runs,
        "tasks": tasks,
        "kinds": [k for k, w in KIND_WEIGHTS.items() for _ in range(w)],
        "errors": [k for k, w in ERROR_WEIGHTS.items() for _ in range(w)],
        "priority_by_kind": json.dumps({k.value: int(p) for k, p in PRIORITY_BY_TRIGGER.items()}),
        "live": LIVE_RUNS,
    }
    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE task_history, task_history_audit, run_event_outbox, task_quota_usage"
        )
        cursor.execute("SELECT setseed(0.13)")
        # The row triggers (audit, webhook events, coverage rows) stay off for the load.
        cursor.execute("SET session_replication_role = replica")
        for statement in HISTORY_SQL:
            cursor.execute(statement, params)
        cursor.execute("SET session_replication_role = DEFAULT")
        cursor.execute("VACUUM ANALYZE task_history")
        cursor.execute("VACUUM ANALYZE task_history_audit")
        cursor.execute("SELECT state, count(*) FROM task_history GROUP BY 1 ORDER BY 2 DESC")
        states = ", ".join(f"{state} {count}" for state, count in cursor.fetchall())
        cursor.execute(
            "SELECT count(*) FROM task_history"
            " WHERE state = 'failed' AND (error -> 'exhausted') = 'true'::jsonb"
        )
        (dead,) = cursor.fetchone()
    print(f"  loaded in {time.monotonic() - began:.0f} s: {states}; {dead} dead letters")


@dataclass
class Timing:
    label: str
    url: str
    status: int
    median_ms: float
    max_ms: float
    queries: int
    db_ms: float  # the queries' own time, in the traced load

    @property
    def met(self) -> bool:
        return self.status == 200 and self.median_ms <= TARGET_MS


def _placeholders() -> dict[str, str]:
    from django.db.models import Q

    from coverage.models import MediaItemStageState
    from orchestrator.models import TaskHistory

    run = (
        TaskHistory.objects.filter(state="completed")
        .exclude(steps={})
        .exclude(progress=None)
        .values_list("id", flat=True)
        .first()
    )
    dead = (
        TaskHistory.objects.filter(Q(state="failed") & Q(error__exhausted=True))
        .values_list("id", flat=True)
        .first()
    )
    retry = TaskHistory.objects.filter(trigger__has_key="retryOf").values("trigger").first()
    retried = retry["trigger"]["retryOf"] if retry else None
    item = MediaItemStageState.objects.values_list("item_id", flat=True).first()
    week_ago = (datetime.now(UTC) - timedelta(days=7)).date().isoformat()
    return {
        "run": str(run),
        "dead": str(dead),
        "retried": str(retried),
        "item": str(item),
        "week_ago": week_ago,
    }


def time_pages(pages: list[tuple[str, str]], repeat: int, explain: bool) -> list[Timing]:
    import logging

    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user = User.objects.filter(username="bench-console").first()
    if user is None:
        user = User.objects.create_superuser("bench-console", "bench@example.invalid", "unused")
    # A page that raises is a 500 in the table and one line above it, not a traceback.
    logging.getLogger("django.request").setLevel(logging.CRITICAL)
    # An allowed host (LUMASTRA_ALLOWED_HOSTS).
    client = Client(HTTP_HOST="localhost", raise_request_exception=False)
    client.force_login(user)
    values = _placeholders()
    timings = []
    for label, template in pages:
        url = template.format(**values)
        # The warm-up: caches, the pages in shared buffers.
        warm = client.get(url)
        failure = getattr(warm, "exc_info", None)
        if warm.status_code >= 500 and failure:
            print(f"  {label}: {failure[1]!r}", flush=True)
        took = []
        status = 0
        for _ in range(repeat):
            began = time.perf_counter()
            response = client.get(url)
            took.append((time.perf_counter() - began) * 1000)
            status = response.status_code
        with CaptureQueriesContext(connection) as traced:
            client.get(url)
        queries = traced.captured_queries
        timings.append(
            Timing(
                label,
                url,
                status,
                statistics.median(took),
                max(took),
                len(queries),
                sum(float(q["time"]) for q in queries) * 1000,
            )
        )
        print(f"  {label}: {statistics.median(took):.0f} ms", flush=True)
        if explain:
            explain_slowest(label, queries)
    return timings


def explain_slowest(label: str, queries: list[dict[str, str]], top: int = 3) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the page's slowest reads (1 ms or more), as run."""
    from django.db import connection, transaction

    slow = sorted(
        (q for q in queries if _READ.match(q["sql"])),
        key=lambda q: float(q["time"]),
        reverse=True,
    )
    for query in [q for q in slow[:top] if float(q["time"]) >= 0.001]:
        # Rolled back: ANALYZE runs the statement, and a WITH may hold a write.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query['sql']}".replace("%", "%%"))
            plan = "\n".join(f"    {row[0]}" for row in cursor.fetchall())
            transaction.set_rollback(True)
        print(f"\n  EXPLAIN {label} ({float(query['time']) * 1000:.1f} ms as run):")
        print(f"    {query['sql'][:600]}\n{plan}\n", flush=True)


def print_table(timings: list[Timing]) -> None:
    width = max(len(t.label) for t in timings)
    print(f"\n{'page':{width}}  status  median ms  max ms  queries  db ms  target")
    for t in timings:
        verdict = "met" if t.met else "MISSED"
        print(
            f"{t.label:{width}}  {t.status:6}  {t.median_ms:9.1f}  {t.max_ms:6.1f}"
            f"  {t.queries:7}  {t.db_ms:5.1f}  {verdict}"
        )


if __name__ == "__main__":
    sys.exit(main())
