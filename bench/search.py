"""Finding runs by what they were about, at scale: `GET /runs?input.library_id=7` and `tag=`.

    .venv/bin/python bench/search.py [--runs 10000] [--libraries 50] [--repeat 30] [--explain]

Loads, into its own database (`BENCH_SEARCH_DATABASE_URL`, by default `lumastra_bench_search`),
`--runs` runs over `--libraries` libraries (`bench/sql/search_history.sql`, one INSERT … SELECT,
the row triggers off), then VACUUM ANALYZE. Then it times, `--repeat` times each, what the API
runs for each query (`runs.search.matching` and the first page of 50, newest first, as
`GET /runs` pages it), and the count a bulk action's dry run makes; prints p50 and the
slowest, checks each page holds only matching runs and each count is exact, and with
`--explain` prints the plans (`EXPLAIN (ANALYZE, BUFFERS)`). docs/benchmarks.md records
results ("Finding runs").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.database import own_database  # noqa: E402
from bench.throughput import BENCH_ENV  # noqa: E402
from orchestrator import sql  # noqa: E402

SEARCH_ENV = {
    **BENCH_ENV,
    "DATABASE_URL": os.environ.get(
        "BENCH_SEARCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lumastra_bench_search"
    ),
}
LOAD = sql.load(__file__, "search_history")
TASKS = [f"bench-scan-{n}" for n in range(20)]
PAGE = 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--libraries", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args(argv)
    own_database(SEARCH_ENV)
    from orchestrator.runs import search

    load(args.runs, args.libraries)
    library = {"library_id": search.typed("7")}
    queries = {
        "input.library_id=7": search.RunFilter(input=library),
        "input.library_id=7&state=failed": search.RunFilter(input=library, state=_failed()),
        "tag=nightly": search.RunFilter(tags=("nightly",)),
        # Library 10's runs are all tagged (1 in 10, the multiples of 10).
        "input.library_id=10&tag=nightly": search.RunFilter(
            input={"library_id": search.typed("10")}, tags=("nightly",)
        ),
    }
    expected = expected_counts(args.runs, args.libraries)
    print(f"{args.runs} runs over {args.libraries} libraries, {args.repeat} times each:")
    ok = True
    for name, found in queries.items():
        ok &= measure(name, found, expected[name], args)
    return 0 if ok else 1


def _failed() -> Any:
    from orchestrator.states import RunState

    return RunState.FAILED


def load(runs: int, libraries: int) -> None:
    from django.db import connection

    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE task_history, task_history_audit, run_event_outbox")
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(LOAD, {"n": runs, "libraries": libraries, "tasks": TASKS})
        cursor.execute("SET session_replication_role = DEFAULT")
        cursor.execute("VACUUM ANALYZE task_history")
    print(f"loaded in {time.monotonic() - began:.1f} s")


def expected_counts(runs: int, libraries: int) -> dict[str, int | None]:
    """What each query must count, from the load's own arithmetic (None: read, not derived)."""
    seven = sum(1 for g in range(1, runs + 1) if g % libraries == 7)
    tagged = sum(1 for g in range(1, runs + 1) if g % 10 == 0)
    both = sum(1 for g in range(1, runs + 1) if g % libraries == 10 and g % 10 == 0)
    return {
        "input.library_id=7": seven,
        "input.library_id=7&state=failed": None,
        "tag=nightly": tagged,
        "input.library_id=10&tag=nightly": both,
    }


def measure(name: str, found: Any, expected: int | None, args: argparse.Namespace) -> bool:
    from orchestrator.api.pagination import page
    from orchestrator.runs import search

    def first_page() -> list[Any]:
        rows, _ = page(search.matching(found), None, PAGE)
        return rows

    def count() -> int:
        return search.matching(found).count()

    page_ms, rows = _timed(first_page, args.repeat)
    count_ms, counted = _timed(count, args.repeat)
    wrong = [r.id for r in rows if not _matches(r, found)]
    exact = expected is None or counted == expected
    print(
        f"  {name:34} {counted:6} runs; first page p50 {statistics.median(page_ms):6.2f} ms "
        f"(slowest {max(page_ms):6.2f}); count p50 {statistics.median(count_ms):6.2f} ms "
        f"(slowest {max(count_ms):6.2f}); {'ok' if exact and not wrong else 'WRONG'}"
    )
    if args.explain:
        _explain(search.matching(found))
    return exact and not wrong


def _matches(row: Any, found: Any) -> bool:
    inputs = all(row.input.get(key) in values for key, values in found.input.items())
    return inputs and set(found.tags) <= set(row.tags)


def _timed(call: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - began) * 1000)
    return times, result


def _explain(runs: Any) -> None:
    from django.db import connection

    query, params = runs.order_by("-created_at", "-id")[:PAGE].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query}", params)
        for (line,) in cursor.fetchall():
            print(f"      {line}")


if __name__ == "__main__":
    sys.exit(main())
