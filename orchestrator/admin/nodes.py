"""The "Cluster" page (view permission), read-only: the live nodes (host, role, pools,
version, started, last beat), the cluster's leader, and each worker pool's queue depth and
running runs, with a link to Flower for the queues' own view."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from orchestrator.admin import pages
from orchestrator.api.access import Access
from orchestrator.clock import describe
from orchestrator.cluster import leaders, roster
from orchestrator.models import TaskHistory
from orchestrator.routing import plan_pools, pool_of
from orchestrator.states import RunState
from orchestrator.stores import broker
from tasks import registry
from tasks.resources import budgets


@dataclass(frozen=True)
class _NodeRow:
    node: roster.Node
    age: str
    last_beat: str
    leads: bool  # this node holds the cluster seat


@dataclass(frozen=True)
class _PoolRow:
    name: str
    concurrency: int
    queues: int
    waiting: int
    running: int


def _age(started: datetime | None, now: datetime) -> str:
    return "-" if started is None else describe(max(timedelta(0), now - started))


def _pools() -> list[_PoolRow]:
    """Each pool of the plan the worker role starts: its budget, its queues' depth, and its
    active runs (a run counts in its task's pool)."""
    config = settings.CONFIG
    definitions = registry.get()
    plan = plan_pools(
        definitions.values(),
        budgets(config.concurrency_overrides, config.queue_depth_cap_overrides),
        config.per_task_queues,
    )
    running: Counter[str] = Counter()
    active = (
        TaskHistory.objects.filter(state=RunState.ACTIVE)
        .values_list("task_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    for task_id, count in active:
        definition = definitions.get(task_id)
        if definition is not None:
            running[pool_of(definition.resource_class, config.per_task_queues)] += count
    return [
        _PoolRow(
            pool.name,
            pool.concurrency,
            len(pool.queues),
            broker.depth(list(pool.queues)),
            running[pool.name],
        )
        for pool in plan
    ]


def nodes_view(request: HttpRequest) -> HttpResponse:
    now = datetime.now(UTC)
    nodes = sorted(roster.roster(), key=lambda n: (n.role, n.host, n.pid))
    beats = roster.last_beats(nodes)
    leader = leaders.leader()
    page = pages.context(
        request,
        "Cluster",
        nodes=[
            _NodeRow(
                n,
                _age(n.started, now),
                f"{describe(beats[n.instance_id])} ago" if n.instance_id in beats else "-",
                n.instance_id == leader,
            )
            for n in nodes
        ],
        leader=leader,
        # The leader is in the roster (False: none, or its announcement expired).
        leader_live=any(n.instance_id == leader for n in nodes),
        pools=_pools(),
        flower_url=settings.CONFIG.flower_url,
    )
    return TemplateResponse(request, "admin/orchestrator/nodes.html", page)


def url() -> URLPattern:
    return path("nodes/", pages.requires(Access.VIEW, nodes_view), name="orchestrator_nodes")
