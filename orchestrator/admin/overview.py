"""The console's first page (`/admin/`, view permission): an overview to look at rather than
read. Panels: runs completed and failed per minute over the last hour and per day over the
last 30 days (charts drawn as SVG on the server, `charts`), each resource class's queue, the
held runs and the dead letters (`waiting`), the tasks that failed most in the last day
(`activity`), and the nodes in the roster.

Each panel is also served alone, as an HTML fragment (`overview/<panel>/`), which `console.js`
fetches every few seconds (each panel at its own pace) to replace the panel in place: the
minute chart moves without a reload. Django's own index (the apps and models, and "Recent
actions") stays below the panels; staff without the view permission get only that.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from orchestrator.admin import activity, charts, pages, waiting
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.clock import describe
from orchestrator.cluster import leaders, roster
from tasks import registry

TEMPLATE = "admin/orchestrator/overview.html"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Panel:
    name: str
    template: str
    refresh_ms: int  # how often the page fetches it again
    read: Callable[[], dict[str, Any]]

    @property
    def url(self) -> str:
        return reverse("admin:orchestrator_overview_panel", kwargs={"name": self.name})


def _minutes() -> dict[str, Any]:
    bars = activity.per_minute()
    return {
        "heading": "Runs ended per minute, last hour (UTC)",
        "bars": bars,
        "chart": charts.stacked_bars(
            bars,
            chart_id="minutes-chart",
            title="Runs completed and failed per minute over the last hour, UTC",
            key=lambda at: at.strftime("%Y-%m-%dT%H:%MZ"),
            name=lambda at: at.strftime("%H:%M"),
            tick_every=10,
        ),
    }


def _days() -> dict[str, Any]:
    bars = activity.per_day(list(registry.get().values()))
    return {
        "heading": "Runs ended per day, last 30 days (UTC)",
        "bars": bars,
        "chart": charts.stacked_bars(
            bars,
            chart_id="days-chart",
            title="Runs completed and failed per UTC day over the last 30 days",
            key=lambda at: at.date().isoformat(),
            name=lambda at: at.strftime("%b %d"),
            tick_every=5,
        ),
    }


def _waiting() -> dict[str, Any]:
    return {"waiting": waiting.read()}


def _failing() -> dict[str, Any]:
    return {"failing": activity.top_failing(sorted(registry.get()))}


@dataclass(frozen=True)
class _Node:
    node: roster.Node
    last_beat: str
    leads: bool


def _workers() -> dict[str, Any]:
    nodes = sorted(roster.roster(), key=lambda n: (n.role, n.host, n.pid))
    beats = roster.last_beats(nodes)
    leader = leaders.leader()
    rows = [
        _Node(
            n,
            f"{describe(beats[n.instance_id])} ago" if n.instance_id in beats else "-",
            n.instance_id == leader,
        )
        for n in nodes
    ]
    return {"nodes": rows}


CHART = "admin/orchestrator/overview/_chart.html"
PANELS = {
    panel.name: panel
    for panel in (
        Panel("minutes", CHART, 5_000, _minutes),
        Panel("days", CHART, 60_000, _days),
        Panel("waiting", "admin/orchestrator/overview/_waiting.html", 10_000, _waiting),
        Panel("failing", "admin/orchestrator/overview/_failing.html", 30_000, _failing),
        Panel("workers", "admin/orchestrator/overview/_workers.html", 10_000, _workers),
    )
}


def first_page(index: pages.Page) -> pages.Page:
    """The admin's index with the overview's panels above Django's list of apps, for those who
    may view runs; the plain index for other staff."""

    @functools.wraps(index)
    def view(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not access.allows(request.user, Access.VIEW):
            return index(request, extra_context)
        panels = [(panel, _read(panel)) for panel in PANELS.values()]
        return index(request, {**(extra_context or {}), "title": "Overview", "panels": panels})

    return view


def _read(panel: Panel) -> dict[str, Any] | None:
    """A panel's data, or None when a store failed it: the first page still shows the others
    (its own fetch, `panel_view`, answers the error until the store is back)."""
    try:
        return panel.read()
    except Exception:
        log.exception("overview: the %s panel could not be read", panel.name)
        return None


def panel_view(request: HttpRequest, name: str) -> HttpResponse:
    panel = PANELS.get(name)
    if panel is None:
        raise Http404(f"no overview panel {name!r}")
    return TemplateResponse(request, panel.template, {"panel": panel, "data": panel.read()})


def urls() -> list[URLPattern]:
    return [
        path(
            "overview/<slug:name>/",
            pages.requires(Access.VIEW, panel_view),
            name="orchestrator_overview_panel",
        )
    ]
