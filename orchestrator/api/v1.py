"""The HTTP API, version 1, mounted at /api/v1/ (OpenAPI at openapi.json, docs at docs)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver
from ninja import NinjaAPI

from orchestrator.api import errors, events, logs, runs, tasks, webhooks
from orchestrator.api.auth import AUTH

api = NinjaAPI(
    title="Lumastra Tasks",
    version="1",
    description="Start runs, follow them, and list the tasks that can be started.",
    urls_namespace="api-v1",
    auth=AUTH,
)
errors.install(api)
api.add_router("", runs.router)
api.add_router("", logs.router)
api.add_router("", events.router)
api.add_router("", tasks.router)
api.add_router("", webhooks.router)


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """`api.urls` for `include`, its 405s in the error shape."""
    patterns, app_name, namespace = api.urls
    wrapped = [errors.json_405(p) if isinstance(p, URLPattern) else p for p in patterns]
    return wrapped, app_name, namespace
