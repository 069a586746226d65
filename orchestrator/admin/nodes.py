"""The "Nodes" page (view permission): the node roster and the leader of each seat,
read-only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from orchestrator.admin import pages
from orchestrator.api.access import Access
from orchestrator.clock import describe
from orchestrator.cluster import leaders, roster


@dataclass(frozen=True)
class _NodeRow:
    node: roster.Node
    age: str
    leads: tuple[str, ...]  # the seats this node holds


@dataclass(frozen=True)
class _SeatRow:
    seat: str
    instance_id: str | None
    live: bool  # the leader is in the roster (False: none, or its announcement expired)


def _age(started: datetime | None, now: datetime) -> str:
    return "-" if started is None else describe(max(timedelta(0), now - started))


def nodes_view(request: HttpRequest) -> HttpResponse:
    now = datetime.now(UTC)
    nodes = sorted(roster.roster(), key=lambda n: (n.role, n.host, n.pid))
    leading = leaders.leaders()
    by_instance: dict[str, list[str]] = {}
    for seat, instance in leading.items():
        by_instance.setdefault(instance, []).append(seat)
    live = {n.instance_id for n in nodes}
    page = pages.context(
        request,
        "Nodes",
        nodes=[
            _NodeRow(n, _age(n.started, now), tuple(by_instance.get(n.instance_id, ())))
            for n in nodes
        ],
        seats=[
            _SeatRow(seat, leading.get(seat), leading.get(seat) in live)
            for seat in leaders.all_seats()
        ],
    )
    return TemplateResponse(request, "admin/orchestrator/nodes.html", page)


def url() -> URLPattern:
    return path("nodes/", pages.requires(Access.VIEW, nodes_view), name="orchestrator_nodes")
