"""The overview's figures of what waits: each resource class's queue (messages waiting against
its cap, the oldest run waiting now, the 95th percentile of the last hour's waits), the runs
held back (by a pause, a closed run window, a limit with no room), and the dead letters that
wait on an operator.

The figures /metrics gives Prometheus are read from its own collectors (`api.metrics`,
`api.metrics_live`), so the overview, the shipped dashboard and the alert rules never disagree
on what "depth", "oldest wait", "held" or "dead letter" mean; the limits' waiting runs come
from the Limits page's read (`api.limit_usage`). Only the percentile is the overview's own
(`sql/queue_wait.sql`): /metrics keeps no distribution of waits.

The wait of a run, in the percentile: from when it could start (its creation, or its
`not_before` when later: a retry's backoff, a delayed start, a released follow-up) to the
claim of its last attempt, over the runs that started in the last hour. A run still waiting is
not in it (the oldest wait is); nor are a pipeline's later stages, whose run has started.

Not guaranteed: the collectors read their sources one after another, not at one instant.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection
from prometheus_client.registry import Collector

from orchestrator import sql
from orchestrator.api import limit_usage, metrics, metrics_live
from orchestrator.clock import SYSTEM, Clock
from orchestrator.routing import class_queues
from tasks import registry
from tasks.resources import RESOURCE_CLASSES

QUEUE_WAIT = sql.load(__file__, "queue_wait")
WAIT_WINDOW = timedelta(hours=1)

Gauges = dict[str, dict[tuple[str, ...], float]]


@dataclass(frozen=True)
class ClassQueue:
    name: str
    depth: int  # messages waiting in the broker
    cap: int  # LUMASTRA_QUEUE_DEPTH_CAP_<CLASS>
    oldest_s: float  # the oldest run waiting to be claimed now; 0 when none waits
    started: int  # runs of the class that started in the last hour
    p95_s: float | None  # their waits' 95th percentile; None when none started

    @property
    def filled(self) -> float:
        """The share of the cap in use, 0 to 1."""
        return min(self.depth / self.cap, 1.0) if self.cap else 0.0


@dataclass(frozen=True)
class Held:
    by: str  # pause, window or limit
    over: str  # the task (a pause's or a window's), or the limit
    runs: int


@dataclass(frozen=True)
class Waiting:
    queues: list[ClassQueue]
    held: list[Held]
    pauses: list[str]  # the pauses in force: "task x", "class cpu (refusing starts)"
    dead_letters: dict[str, int]  # by kind, as the Dead letters page has them


def read(*, clock: Clock = SYSTEM) -> Waiting:
    gauges = _gauges(metrics.EngineCollector(), metrics_live.LiveCollector())
    dead = {kind: int(n) for (kind,), n in sorted(gauges["lumastra_dead_letters"].items())}
    return Waiting(_queues(gauges, clock), _held(gauges), _pauses(gauges), dead)


def _gauges(*collectors: Collector) -> Gauges:
    """Each sample the collectors give, by family name and label values."""
    found: Gauges = defaultdict(dict)
    for collector in collectors:
        for family in collector.collect():
            for sample in family.samples:
                found[family.name][tuple(sample.labels.values())] = sample.value
    return found


def _queues(gauges: Gauges, clock: Clock) -> list[ClassQueue]:
    definitions = registry.get()
    per_task = settings.CONFIG.per_task_queues
    classes = [n for n in RESOURCE_CLASSES if class_queues(definitions.values(), n, per_task)]
    ids = sorted(definitions)
    with connection.cursor() as cursor:
        cursor.execute(
            QUEUE_WAIT,
            {
                "since": clock.now() - WAIT_WINDOW,
                "task_ids": ids,
                "classes": [definitions[task_id].resource_class for task_id in ids],
            },
        )
        waits = {name: (n, p95) for name, n, p95 in cursor.fetchall()}
    return [
        ClassQueue(
            name,
            int(gauges["lumastra_task_queue_depth"].get((name,), 0)),
            int(gauges["lumastra_task_queue_depth_cap"].get((name,), 0)),
            gauges["lumastra_task_queue_wait_seconds"].get((name,), 0.0),
            waits.get(name, (0, None))[0],
            _seconds(waits.get(name, (0, None))[1]),
        )
        for name in classes
    ]


def _seconds(span: timedelta | None) -> float | None:
    return None if span is None else span.total_seconds()


def _held(gauges: Gauges) -> list[Held]:
    held = [
        Held("pause", task_id, int(n))
        for (task_id,), n in sorted(gauges["lumastra_paused_runs"].items())
    ]
    held += [
        Held("window", task_id, int(n))
        for (_class, task_id), n in sorted(gauges["lumastra_window_held_runs"].items())
    ]
    held += [
        Held("limit", limit.name, waiting)
        for limit in limit_usage.overview()
        if (waiting := sum(key.waiting for key in limit.keys))
    ]
    return held


def _pauses(gauges: Gauges) -> list[str]:
    return [
        f"{scope} {name}" + (" (refusing starts)" if refuse == "true" else "")
        for scope, name, refuse in sorted(_labels(gauges["lumastra_paused"]))
    ]


def _labels(samples: dict[tuple[str, ...], float]) -> Iterable[tuple[str, ...]]:
    return (labels for labels, value in samples.items() if value)
