"""The /metrics families that say what waits on an operator now, for the dashboard and the
alert rules in deploy/observability/: the node roster by role, the drain's lists, the dead
letters by kind, and each resource class's queue cap and wait. Registered beside the engine's
collector (`api.metrics`), read at each scrape (one read per family), never kept in a process.

Not guaranteed: the wait is that of runs, so a pipeline's stages waiting in their class's
queues (their run is active) are not in it; the roster is as `cluster.roster` reads it, so a
process frozen longer than the roster's TTL is missing until it resumes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from django.conf import settings
from django.db.models import (
    CharField,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    Max,
    Q,
    Value,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Greatest, Now
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.api.dead_letters import Kind
from orchestrator.cluster import roster
from orchestrator.models import TaskHistory
from orchestrator.routing import class_limit, class_queues
from orchestrator.runs import drain
from orchestrator.runs.rerun import dead_letters
from orchestrator.states import RunState
from orchestrator.webhooks.delivery import dead
from tasks import registry
from tasks.resources import RESOURCE_CLASSES

# Roles reported even when no node has them, so an alert on a count of 0 can fire: a worker
# role's Celery workers and its loops process; its restarted children (the file watcher) are
# added from `settings.LUMASTRA_WORKER_CHILDREN`.
_ROLES = ("worker", "loops")
_DUE_AT = Cast(KT("trigger__notBefore"), DateTimeField())


class LiveCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield _roster()
        waiting, poisoned = drain.depth()
        yield _drain(waiting, poisoned)
        yield _dead_letters(poisoned)
        yield from _queues()


def _roster() -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(
        "lumastra_roster_nodes",
        "Processes announced in the node roster, by role (worker: a Celery worker, loops: the "
        "orchestrator loops, watcher: the file watcher)",
        labels=["role"],
    )
    counts = Counter({role: 0 for role in (*_ROLES, *settings.LUMASTRA_WORKER_CHILDREN)})
    counts.update(node.role for node in roster.roster())
    for role, n in sorted(counts.items()):
        gauge.add_metric([role], n)
    return gauge


def _drain(waiting: int, poisoned: int) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(
        "lumastra_drain_entries",
        "Writes Postgres refused, in the drain: waiting (or in flight) for the leader's replay, "
        "and poison (refused too often, kept for an operator)",
        labels=["list"],
    )
    gauge.add_metric(["waiting"], waiting)
    gauge.add_metric(["poison"], poisoned)
    return gauge


def _dead_letters(poisoned: int) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(
        "lumastra_dead_letters",
        "What stopped being retried and waits for an operator (the Dead letters page), by kind",
        labels=["kind"],
    )
    # Each count is served by its partial index; one query for both.
    counts = [
        rows.order_by()
        .values(kind=Value(kind.value, CharField()))
        .annotate(n=Count("pk"))
        .values_list("kind", "n")
        for rows, kind in ((dead_letters(), Kind.EXHAUSTED_RUN), (dead(), Kind.WEBHOOK_DELIVERY))
    ]
    found: dict[str, int] = dict(counts[0].union(counts[1], all=True))
    found[Kind.DRAIN_POISON.value] = poisoned
    for kind in Kind:
        gauge.add_metric([kind.value], found.get(kind.value, 0))
    return gauge


def _queues() -> Iterator[Metric]:
    caps = GaugeMetricFamily(
        "lumastra_task_queue_depth_cap",
        "The waiting messages a resource class may hold (LUMASTRA_QUEUE_DEPTH_CAP_<CLASS>); at "
        "it a start is dropped, refused or sheds older ones, by its task's policy",
        labels=["resource_class"],
    )
    waits = GaugeMetricFamily(
        "lumastra_task_queue_wait_seconds",
        "How long the oldest run waiting to be claimed (pending and due, held ones too) has "
        "waited, by resource class; 0 when none waits",
        labels=["resource_class"],
    )
    definitions = registry.get()
    per_task = settings.CONFIG.per_task_queues
    classes = [
        name for name in RESOURCE_CLASSES if class_queues(definitions.values(), name, per_task)
    ]
    # Postgres's clock, as the rows' times are. A run waits from its `not_before` once due (a
    # retry, a released follow-up), or from when a delayed or debounced start was due (the
    # trigger keeps it once the release cleared `not_before`), else from its creation.
    waited = (
        TaskHistory.objects.filter(state=RunState.PENDING)
        .filter(Q(not_before__isnull=True) | Q(not_before__lte=Now()))
        .values("task_id")
        .order_by()
        .annotate(
            wait=Max(
                ExpressionWrapper(
                    Now() - Greatest("created_at", "not_before", _DUE_AT),
                    output_field=DurationField(),
                )
            )
        )
        .values_list("task_id", "wait")
    )
    longest: dict[str, float] = {}
    for task_id, wait in waited:
        definition = definitions.get(task_id)
        if definition is not None:
            seconds = max(wait.total_seconds(), 0.0)
            resource_class = definition.resource_class
            longest[resource_class] = max(longest.get(resource_class, 0.0), seconds)
    for name in classes:
        caps.add_metric([name], class_limit(name).cap)
        waits.add_metric([name], longest.get(name, 0.0))
    yield caps
    yield waits
