"""The bare Celery side of the benchmarks: a no-op task and a trickplay encode (bench/media.py),
no Django, no Lumastra.

Delivery settings are Lumastra's own: the benchmark passes them in BENCH_DELIVERY_SETTINGS
(JSON), because lumastra/settings.py keeps changing and a copy here would drift; the values
below only serve a run of this app on its own. The benchmark checks the two apps agree before
it measures, so the only difference between the sides is Lumastra itself.

Completion is counted with one INCR per task in the benchmark's own Redis DB. That round trip
happens in the pool child, which is not the bottleneck for no-op work, so it costs
the bare side little; if anything it flatters Lumastra's ratio slightly.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from functools import cache

import redis
from celery import Celery

QUEUE = "bench.bare"
TASK_NAME = "bench-bare-noop"
DONE_KEY = "bench:bare:done"
FIRST_AT_KEY = "bench:bare:first_at"
FINISHED_AT_KEY = "bench:bare:finished_at"

# set_as_current=False: the benchmark process also holds Lumastra's app, and start_run
# publishes through `current_app`; this app must not take its place.
app = Celery("bench_bare", broker=os.environ["CELERY_BROKER_URL"], set_as_current=False)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "priority_steps": [1, 2, 3, 5, 7],
        "queue_order_strategy": "round_robin",  # as lumastra/settings.py
        "visibility_timeout": 3600,
    },
    task_default_priority=5,
)
app.conf.update(json.loads(os.environ.get("BENCH_DELIVERY_SETTINGS", "{}")))


@cache
def _counter() -> redis.Redis:
    return redis.Redis.from_url(os.environ["VALKEY_URL"])


@app.task(name=TASK_NAME)
def noop(total: int) -> None:
    # The first and the last task stamp the time, so the measurement depends neither on how
    # often the benchmark polls nor on when the worker's consumer noticed the opened queue.
    done = _counter().incr(DONE_KEY)
    if done == 1:
        _counter().set(FIRST_AT_KEY, repr(time.time()))
    if done == total:
        _counter().set(FINISHED_AT_KEY, repr(time.time()))


MEDIA_QUEUE = "bench.bare.media"
MEDIA_TASK_NAME = "bench-bare-trickplay"
MEDIA_DONE_KEY = "bench:bare:media:done"
MEDIA_FIRST_AT_KEY = "bench:bare:media:first_at"
MEDIA_FINISHED_AT_KEY = "bench:bare:media:finished_at"


@app.task(name=MEDIA_TASK_NAME)
def trickplay(argv: list[str], cwd: str, partial: str, sprite: str, total: int) -> None:
    """bench/media.py's bare side: the same ffmpeg command the trickplay task runs, the way a
    plain Celery task runs it (subprocess.run, no group, no death signal, no log)."""
    # The bench's own argv (Sprite.argv), no shell.
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    os.replace(partial, sprite)
    done = _counter().incr(MEDIA_DONE_KEY)
    if done == 1:
        _counter().set(MEDIA_FIRST_AT_KEY, repr(time.time()))
    if done == total:
        _counter().set(MEDIA_FINISHED_AT_KEY, repr(time.time()))
