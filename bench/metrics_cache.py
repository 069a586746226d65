"""What the cache Valkey saves a `/metrics` scrape (issue 25).

    .venv/bin/python bench/metrics_cache.py [--scrapes 200] [--runs 2000]

On the bench stores (bench/throughput.py's: its own database and Redis DBs), with `--runs`
ended runs counted in Valkey, scrapes
`/metrics` through Django's test client (the view, its store reads and the rendering; no HTTP
server) `--scrapes` times computed every time (LUMASTRA_METRICS_CACHE_S=0), then as many with
the default cache (5 s: every scrape but the first of each window is served from the cache
Valkey). Prints the median and p95 ms of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.throughput import setup  # noqa: E402

TOKEN = "bench-metrics-token"


def _scrapes(client: object, n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")  # type: ignore[attr-defined]
        took.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.content
    return took


def _line(label: str, took: list[float]) -> str:
    p95 = statistics.quantiles(took, n=20)[18]
    return f"{label:<28} median {statistics.median(took):7.2f} ms   p95 {p95:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    setup()
    from django.conf import settings
    from django.test import Client

    from orchestrator.stores import counters
    from tasks import registry

    tasks = list(registry.get())
    counts = {(tasks[i % len(tasks)], "completed"): 1 for i in range(args.runs)}
    counters.add_many(counters.RUNS, counts)
    client = Client(SERVER_NAME="localhost")  # an allowed host (LUMASTRA_ALLOWED_HOSTS)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, metrics_token=TOKEN, metrics_cache_s=0)
    _scrapes(client, 1)
    computed = _scrapes(client, args.scrapes)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, metrics_cache_s=5)
    _scrapes(client, 1)
    cached = _scrapes(client, args.scrapes)
    print(f"{len(tasks)} tasks, {args.scrapes} scrapes each way")
    print(_line("computed every scrape", computed))
    print(_line("cached (5 s, cache Valkey)", cached))
    print(f"a cached scrape costs {statistics.median(cached) / statistics.median(computed):.0%}")


if __name__ == "__main__":
    main()
