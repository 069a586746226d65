"""The "Providers" page (view permission), read-only: every metadata provider with its calls by
outcome, errors, fetch latency p50/p95 and circuit, as `GET /api/v1/providers` answers
(`orchestrator.providers.overview`)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from orchestrator import providers
from orchestrator.admin import pages
from orchestrator.api.access import Access


def providers_view(request: HttpRequest) -> HttpResponse:
    page = pages.context(request, "Providers", providers=providers.overview())
    return TemplateResponse(request, "admin/orchestrator/providers.html", page)


def url() -> URLPattern:
    return path(
        "providers/", pages.requires(Access.VIEW, providers_view), name="orchestrator_providers"
    )
