"""The HTTP API, version 1, mounted at /api/v1/ (OpenAPI at openapi.json, docs at docs)."""

from __future__ import annotations

import json
from typing import Any, cast

from django.http import HttpRequest
from django.urls import URLPattern, URLResolver
from ninja import NinjaAPI
from ninja.parser import Parser

from orchestrator.api import (
    batch,
    cluster,
    dead_letters,
    errors,
    events,
    limit_usage,
    logs,
    pauses,
    providers,
    run_search,
    runs,
    schedules,
    tasks,
    trickplay,
    triggers,
    webhooks,
    windows,
)
from orchestrator.api.auth import AUTH

_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


class Utf8Json(Parser):
    """JSON bodies in UTF-8 only (RFC 8259): `json.loads` on bytes would also guess UTF-16 and
    UTF-32, so a body every other JSON reader refuses was taken."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        if request.content_type in _FORMS and not (request.POST or request.FILES):
            # An empty form is what many clients send for a POST without a body (Django's test
            # client, form posts): no body, so an operation's optional body keeps its default.
            return {}
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"JSON must be UTF-8 (RFC 8259); byte {exc.start} is not") from None
        return cast(dict[str, Any], json.loads(text))


api = NinjaAPI(
    title="Lumastra Tasks",
    version="1",
    description="Start runs, follow them, and list the tasks that can be started.",
    urls_namespace="api-v1",
    auth=AUTH,
    parser=Utf8Json(),
)
errors.install(api)
api.add_router("", runs.router)
api.add_router("", batch.router)
api.add_router("", run_search.router)
api.add_router("", logs.router)
api.add_router("", events.router)
api.add_router("", tasks.router)
api.add_router("", webhooks.router)
api.add_router("", triggers.router)
api.add_router("", dead_letters.router)
api.add_router("", schedules.router)
api.add_router("", cluster.router)
api.add_router("", pauses.router)
api.add_router("", windows.router)
api.add_router("", limit_usage.router)
api.add_router("", providers.router)
api.add_router("", trickplay.router)


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """`api.urls` for `include`, its 405s in the error shape."""
    patterns, app_name, namespace = api.urls
    wrapped = [errors.json_405(p) if isinstance(p, URLPattern) else p for p in patterns]
    return wrapped, app_name, namespace
