"""Health probes: `GET /healthz`, `GET /readyz` and `manage.py healthcheck [--ready]`.

- **Liveness** (`/healthz`, `healthcheck`): the process answers. 200 `ok`; it reads no store,
  so a database outage never gets a healthy web replica restarted.
- **Readiness** (`/readyz`, `healthcheck --ready`): this process can do its work now:
  PostgreSQL answers, every migration the code ships with is applied, the coordination Valkey
  answers and the Celery broker accepts a connection. 200 when all are ok, else 503; the body
  names each dependency with `ok` or `fail` and nothing more (no host, no error text), since
  the probes are unauthenticated.

Each store is checked on a fresh connection with a short timeout
(`LUMASTRA_HEALTH_TIMEOUT_S`), never on the process's pooled clients: a probe must not wait on
a socket with no timeout, or leave a pooled connection in a state the next run would meet.
The cache Valkey is not checked: it holds nothing of value and a run never needs it.

`ProbeMiddleware`, first in `MIDDLEWARE`, answers the two paths before host validation and
the HTTPS redirect: probes come from the container runtime with the container's address as
`Host` and over plain HTTP. The URLconf routes the same views for a stack without it.

Not guaranteed: ready means reachable at the moment of the probe, not that a run started now
will finish; a broker that accepts connections may still refuse writes (a full disk).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse

log = logging.getLogger(__name__)

Status = Literal["ok", "fail"]

# The order the body lists them in: a later check means little when an earlier one failed
# (migrations cannot be read from a database that is down).
DEPENDENCIES = ("postgres", "migrations", "valkey", "broker")

PROBE_PATHS = ("/healthz", "/readyz")


def _postgres() -> None:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")


def _migrations() -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    executor = MigrationExecutor(connection)
    missing = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if missing:
        raise RuntimeError(f"{len(missing)} migration(s) not applied, first {missing[0][0]}")


def _redis_ping(url: str) -> None:
    timeout = settings.CONFIG.health_timeout_s
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    finally:
        client.connection_pool.disconnect()


def _valkey() -> None:
    _redis_ping(settings.CONFIG.valkey_url)


def _broker() -> None:
    # The broker is Redis or Valkey (docs/environment.md): a PING is a connection accepted.
    _redis_ping(settings.CONFIG.celery_broker_url)


_CHECKS: dict[str, Callable[[], None]] = {
    "postgres": _postgres,
    "migrations": _migrations,
    "valkey": _valkey,
    "broker": _broker,
}


def readiness() -> dict[str, Status]:
    """Each dependency's status, in DEPENDENCIES order; a failure is logged with its cause."""
    statuses: dict[str, Status] = {}
    for name in DEPENDENCIES:
        if name == "migrations" and statuses.get("postgres") == "fail":
            statuses[name] = "fail"
            continue
        try:
            _CHECKS[name]()
        except Exception as exc:  # any failure means "not ready"; the cause goes to the log
            log.warning("readiness: %s is not ready: %s: %s", name, type(exc).__name__, exc)
            statuses[name] = "fail"
        else:
            statuses[name] = "ok"
    return statuses


def is_ready(statuses: dict[str, Status]) -> bool:
    return all(status == "ok" for status in statuses.values())


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


def readyz(request: HttpRequest) -> HttpResponse:
    statuses = readiness()
    response = JsonResponse(statuses, status=200 if is_ready(statuses) else 503)
    response["Cache-Control"] = "no-store"
    return response


class ProbeMiddleware:
    """Answers GET/HEAD on the probe paths before any other middleware (see the module)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in PROBE_PATHS and request.method in ("GET", "HEAD"):
            return healthz(request) if request.path == "/healthz" else readyz(request)
        return self.get_response(request)
