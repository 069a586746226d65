"""The HTTP API, version 1, mounted at /api/v1/ (OpenAPI at openapi.json, docs at docs)."""

from __future__ import annotations

from ninja import NinjaAPI

from orchestrator.api import errors, runs, tasks
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
api.add_router("", tasks.router)
