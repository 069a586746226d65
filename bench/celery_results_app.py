"""The Celery + django-celery-results peer of bench/peers.py: one no-op task whose result
django-celery-results writes to Postgres (`result_backend = "django-db"`).

Its Django settings are bench/celery_results_settings.py and its broker is
PEER_RESULTS_BROKER_URL, both forced here (not defaulted): the benchmark's environment names
Lumastra's settings and broker, and this app must never run on those.
Because of that, bench/peers.py never imports this module; it runs it as subprocesses:

    .venv/bin/python -m celery -A bench.celery_results_app worker ...
    .venv/bin/python -m bench.celery_results_app migrate
    .venv/bin/python -m bench.celery_results_app enqueue N   # prints one JSON line
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.celery_results_settings"
# Celery reads CELERY_BROKER_URL before any setting, and the benchmark's environment names the
# Lumastra side's broker there.
os.environ["CELERY_BROKER_URL"] = os.environ["PEER_RESULTS_BROKER_URL"]

from celery import Celery

from bench import celery_results_settings as settings

app = Celery("bench_celery_results", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(name=settings.TASK_NAME)
def noop() -> None:
    return None


def enqueue(runs: int, priority: int) -> list[float]:
    """Publish `runs` tasks one call at a time; seconds per call."""
    latencies = []
    for _ in range(runs):
        began = time.perf_counter()
        noop.apply_async(queue=settings.QUEUE, priority=priority)
        latencies.append(time.perf_counter() - began)
    return latencies


def delivery(keys: list[str]) -> dict[str, Any]:
    return {key: app.conf[key] for key in keys}


if __name__ == "__main__":
    import django

    django.setup()
    if sys.argv[1:2] == ["migrate"]:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    elif sys.argv[1:2] == ["enqueue"] and len(sys.argv) == 5:
        runs, priority, keys = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
        latencies = enqueue(runs, priority)
        print(json.dumps({"latencies": latencies, "delivery": delivery(keys)}))
    else:
        sys.exit("usage: python -m bench.celery_results_app migrate | enqueue N PRIORITY KEYS")
