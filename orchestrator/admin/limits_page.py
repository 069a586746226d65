"""The "Limits" page (view permission), read-only: every named limit and keyed concurrency,
each key with its units in use, waiting runs, rate window and turn, as `GET /api/v1/limits`
answers (`api.limit_usage.overview`)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from orchestrator.admin import pages
from orchestrator.api.access import Access
from orchestrator.api.limit_usage import overview


def limits_view(request: HttpRequest) -> HttpResponse:
    page = pages.context(request, "Limits", limits=overview())
    return TemplateResponse(request, "admin/orchestrator/limits.html", page)


def url() -> URLPattern:
    return path("limits/", pages.requires(Access.VIEW, limits_view), name="orchestrator_limits")
