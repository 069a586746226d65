"""`GET /metrics`: Prometheus metrics for the whole cluster, whichever web replica is scraped.

Everything is read at scrape time from the shared stores, never from the process: counters
from Valkey (`stores.counters`: runs by task and state, run durations, cost units, refusals by
code, deliveries, recovery), gauges from Valkey (queue depth per resource class, circuit
state, the cluster's leader) and Postgres (active runs per task), what waits on an operator
(`metrics_live`: the roster, the drain, dead letters, each class's queue cap and wait), and the
collectors of the apps above the engine named in `settings.LUMASTRA_METRICS_COLLECTORS` (the
coverage backlog).

Gated by `Authorization: Bearer $LUMASTRA_METRICS_TOKEN` (compared in constant time; a wrong
or missing token is a 401 and counts against the client address's sign-in budget, as the
API's tokens do). With the variable unset the endpoint answers 404, and the web role says so
at start (`lumastra.web`).

One body serves every scrape of any web replica for LUMASTRA_METRICS_CACHE_S (5 s), kept in
the cache Valkey (`stores.cache`): several Prometheus servers, or one scraping each replica,
cost one read of the stores, and a cache that is gone costs only that read.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Case, Count, Sum, Value, When
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from orchestrator.api import metrics_live, throttle
from orchestrator.cluster import leaders
from orchestrator.hooks import circuit
from orchestrator.models import CircuitState, RunBatch, TaskHistory
from orchestrator.recovery import pauses
from orchestrator.routing import class_queues
from orchestrator.states import RunState
from orchestrator.stores import broker, cache, counters, keys
from tasks import registry
from tasks.definition import Priority
from tasks.resources import RESOURCE_CLASSES


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.CONFIG.metrics_token
    if not token:
        return JsonResponse(
            {"detail": "metrics are disabled: set LUMASTRA_METRICS_TOKEN"}, status=404
        )
    address = throttle.client_address(request)
    wait = throttle.blocked_for(address)
    if wait is not None:
        refused = JsonResponse({"detail": throttle.refusal(wait)}, status=429)
        refused["Retry-After"] = str(math.ceil(wait.total_seconds()))
        return refused
    header = request.headers.get("Authorization", "")
    given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        throttle.record_failure(address)
        refused = JsonResponse({"detail": "a valid metrics bearer token is required"}, status=401)
        refused["WWW-Authenticate"] = "Bearer"
        return refused
    body = cache.remembered(keys.cached("metrics"), settings.CONFIG.metrics_cache_s, _scrape)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def _scrape() -> bytes:
    scraped = CollectorRegistry(auto_describe=False)
    scraped.register(EngineCollector())
    scraped.register(metrics_live.LiveCollector())
    for path in settings.LUMASTRA_METRICS_COLLECTORS:
        scraped.register(import_string(path)())
    return generate_latest(scraped)


class EngineCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        found = counters.read_all(
            (
                counters.RUNS,
                counters.DURATION,
                counters.COST,
                counters.REFUSALS,
                counters.DELIVERY,
                counters.RECOVERY,
                counters.SCHEDULE_SKIPS,
                counters.SCHEDULE_PAUSES,
                counters.START_OUTCOMES,
                counters.PROVIDER_CALLS,
            )
        )
        yield _counter(
            "lumastra_task_runs", "Runs ended, by task and state", ["task", "state"], found,
            counters.RUNS,
        )  # fmt: skip
        yield _histogram(found[counters.DURATION])
        yield _counter(
            "lumastra_task_cost_units", "Units spent (ctx.spend), by task and kind",
            ["task", "kind"], found, counters.COST,
        )  # fmt: skip
        yield _counter(
            "lumastra_task_refusals", "Starts refused at admission, by task and code",
            ["task", "code"], found, counters.REFUSALS,
        )  # fmt: skip
        yield _counter(
            "lumastra_delivery", "Run messages published, redelivered, and dropped as duplicates",
            ["event"], found, counters.DELIVERY,
        )  # fmt: skip
        yield _counter(
            "lumastra_recovery",
            "Recovery: orphans failed, runs published again, pending runs failed, drain "
            "writes replayed, drain entries poisoned",
            ["event"], found, counters.RECOVERY,
        )  # fmt: skip
        yield _counter(
            "lumastra_schedule_skips", "Schedule slots skipped: the previous fire's run was live",
            ["task"], found, counters.SCHEDULE_SKIPS,
        )  # fmt: skip
        yield _counter(
            "lumastra_schedule_paused", "Schedules switched off by pause_on_failure (issue 38)",
            ["task"], found, counters.SCHEDULE_PAUSES,
        )  # fmt: skip
        yield _counter(
            "lumastra_start_outcomes",
            "Starts by what they were answered: started (a new run), deduplicated, debounced, "
            "coalesced, throttled, dropped (issue 39)",
            ["task", "outcome"], found, counters.START_OUTCOMES,
        )  # fmt: skip
        yield _counter(
            "lumastra_provider_calls",
            "Provider calls by how they were answered: fetched, cached, stale (an older answer "
            "after a failure), failed (no answer) (issue 41)",
            ["provider", "outcome"], found, counters.PROVIDER_CALLS,
        )  # fmt: skip
        yield self._queue_depth()
        yield self._active_runs()
        yield self._live_children()
        yield self._circuits()
        yield from self._pauses()
        yield from self._leaders()

    @staticmethod
    def _queue_depth() -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(
            "lumastra_task_queue_depth",
            "Messages waiting in the broker, by resource class",
            labels=["resource_class"],
        )
        definitions = list(registry.get().values())
        per_task = settings.CONFIG.per_task_queues
        for resource_class in RESOURCE_CLASSES:
            queues = class_queues(definitions, resource_class, per_task)
            if queues:
                gauge.add_metric([resource_class], broker.depth(queues))
        return gauge

    @staticmethod
    def _active_runs() -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(
            "lumastra_task_active_runs", "Runs executing now, by task", labels=["task"]
        )
        running = dict(
            TaskHistory.objects.filter(state=RunState.ACTIVE)
            .values_list("task_id")
            .order_by()
            .annotate(n=Count("id"))
            .values_list("task_id", "n")
        )
        for task_id in registry.get():
            gauge.add_metric([task_id], running.get(task_id, 0))
        return gauge

    @staticmethod
    def _live_children() -> GaugeMetricFamily:
        # The batches' own counts of runs not yet ended (`runs.children`), not a count of rows.
        gauge = GaugeMetricFamily(
            "lumastra_live_children",
            "Child runs (ctx.spawn) not yet ended, and runs of callers' batches not yet ended",
            labels=["of"],
        )
        open_by = dict(
            RunBatch.objects.filter(open__gt=0)
            .annotate(of=Case(When(parent_run_id__isnull=True, then=Value("batch")),
                              default=Value("parent")))
            .values_list("of")
            .order_by()
            .annotate(n=Sum("open"))
            .values_list("of", "n")
        )  # fmt: skip
        for of in ("parent", "batch"):
            gauge.add_metric([of], open_by.get(of, 0))
        return gauge

    @staticmethod
    def _circuits() -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(
            "lumastra_task_circuit_state",
            "1 for each task's circuit state (closed, open, half_open)",
            labels=["task", "state"],
        )
        for task_id, status in circuit.statuses(registry.get()).items():
            for state in CircuitState:
                gauge.add_metric([task_id, state.value], int(status.state == state))
        return gauge

    @staticmethod
    def _pauses() -> Iterator[Metric]:
        paused = GaugeMetricFamily(
            "lumastra_paused",
            "1 for each pause in force (recovery.pauses), by scope (task, class) and name",
            labels=["scope", "name", "refuse_starts"],
        )
        held = GaugeMetricFamily(
            "lumastra_paused_runs", "Pending runs a pause holds, by task", labels=["task"]
        )
        windowed = GaugeMetricFamily(
            "lumastra_window_held_runs",
            "Pending runs a closed run window holds, by class and task (issue 38)",
            labels=["class", "task"],
        )
        for row in pauses.in_force():
            paused.add_metric([row.scope, row.name, str(row.refuse_starts).lower()], 1)
        holds = pauses.Holds.load(0)
        found = registry.get()
        held_any = holds.paused or holds.windowed
        by = {t: holds.held_by(t) for t in sorted(found)} if held_any else {}
        by = {task_id: reason for task_id, reason in by.items() if reason is not None}
        # Only the held tasks' pending runs are counted, not every task's backlog; an
        # operator's run (priority 1) passes a window.
        waiting = (
            TaskHistory.objects.filter(state=RunState.PENDING, task_id__in=list(by))
            .values_list("task_id", "priority")
            .order_by()
            .annotate(n=Count("id"))
        )
        counts = {task_id: [0, 0] for task_id in by}
        for task_id, priority, n in waiting:
            counts[task_id][0] += n
            counts[task_id][1] += 0 if priority == Priority.OPERATOR else n
        for task_id, reason in by.items():
            if reason == "pause":
                held.add_metric([task_id], counts[task_id][0])
            else:
                windowed.add_metric([found[task_id].resource_class, task_id], counts[task_id][1])
        yield paused
        yield held
        yield windowed

    @staticmethod
    def _leaders() -> Iterator[Metric]:
        holder = leaders.leader()
        held = GaugeMetricFamily(
            "lumastra_leader_seat_held",
            "1 when a process holds the cluster seat (lock:orch:cluster)",
            labels=["seat"],
        )
        held.add_metric([leaders.CLUSTER], int(holder is not None))
        holders = GaugeMetricFamily(
            "lumastra_leader", "The process holding the cluster seat", labels=["seat", "instance"]
        )
        if holder is not None:
            holders.add_metric([leaders.CLUSTER, holder], 1)
        yield held
        yield holders


def _counter(
    name: str,
    documentation: str,
    labels: list[str],
    found: dict[str, dict[tuple[str, ...], float]],
    family: str,
) -> CounterMetricFamily:
    counter = CounterMetricFamily(name, documentation, labels=labels)
    for label_values, value in sorted(found[family].items()):
        if len(label_values) == len(labels):
            counter.add_metric(list(label_values), value)
    return counter


def _histogram(fields: dict[tuple[str, ...], float]) -> HistogramMetricFamily:
    histogram = HistogramMetricFamily(
        "lumastra_task_duration_seconds",
        "Run durations from claim to end, by task",
        labels=["task"],
    )
    tasks = sorted({labels[0] for labels in fields if len(labels) == 2})
    bounds = [*(str(bound) for bound in counters.DURATION_BUCKETS), "+Inf"]
    for task in tasks:
        cumulative = 0.0
        buckets = []
        for index, bound in enumerate(bounds):
            cumulative += fields.get((task, str(index)), 0.0)
            buckets.append((bound, cumulative))
        histogram.add_metric([task], buckets, fields.get((task, "sum"), 0.0))
    return histogram
