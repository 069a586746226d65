"""`GET /providers` (issue 41): every metadata provider (`define_provider`) with its calls by
outcome, its errors, its fetch latency p50/p95 and its circuit (`orchestrator.providers`); the
Providers page shows the same."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Field, Router, Schema

from orchestrator import providers
from orchestrator.api.auth import VIEW
from orchestrator.api.errors import answers
from orchestrator.api.tasks import CircuitOut, circuit_out

router = Router(tags=["providers"])


class ProviderOut(Schema):
    id: str
    timeout_s: float
    cache_s: int = Field(description="seconds an answer is served from the cache")
    limits: list[str] = Field(description="named limits each fetch takes one unit of")
    calls: dict[str, int] = Field(
        description="calls by outcome: fetched, cached, stale (an older answer after a "
        "failure), failed (no answer)"
    )
    errors: int = Field(description="calls given no fresh answer: stale plus failed")
    p50_ms: float | None = Field(description="median fetch latency of the newest 1,000 fetches")
    p95_ms: float | None
    circuit: CircuitOut


@router.get("/providers", auth=VIEW, response=answers({200: list[ProviderOut]}))
def list_providers(request: HttpRequest) -> list[ProviderOut]:
    """Every provider with its calls, errors, latency and circuit."""
    return [
        ProviderOut(
            id=found.id,
            timeout_s=found.timeout_s,
            cache_s=found.cache_s,
            limits=list(found.limits),
            calls=found.calls,
            errors=found.errors,
            p50_ms=found.p50_ms,
            p95_ms=found.p95_ms,
            circuit=circuit_out(found.circuit),
        )
        for found in providers.overview()
    ]
