"""`/webhooks`: the endpoints run events are delivered to (docs/webhooks.md).

Creating one answers its signing secret, once; listing never shows it. Views never send or
write deliveries: `webhooks.delivery` does.
"""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema
from ninja.responses import Status

from orchestrator.api.auth import OPERATE, VIEW
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.fields import StorableStr
from orchestrator.models import WebhookEndpoint
from orchestrator.states import RunState
from orchestrator.webhooks.delivery import InvalidEndpoint, UnknownTasks, create_endpoint

router = Router(tags=["webhooks"])


class EndpointIn(Schema):
    url: str = Field(
        max_length=500,
        pattern=r"^https?://[^\s\u0000]+$",
        description="http:// or https:// URL to POST to",
    )
    states: list[RunState] = Field(
        default_factory=list, max_length=6, description="run states to deliver; empty: all"
    )
    tasks: list[StorableStr] = Field(
        default_factory=list, max_length=200, description="task ids to deliver for; empty: all"
    )
    description: StorableStr = Field("", max_length=200)


class EndpointOut(Schema):
    id: int
    url: str
    states: list[str]
    tasks: list[str]
    description: str
    enabled: bool
    created_at: datetime


class CreatedEndpoint(EndpointOut):
    secret: str = Field(description="signs every delivery (X-Lumastra-Signature); shown once")


def _out(endpoint: WebhookEndpoint) -> EndpointOut:
    return EndpointOut(
        id=endpoint.id,
        url=endpoint.url,
        states=list(endpoint.states),
        tasks=list(endpoint.tasks),
        description=endpoint.description,
        enabled=endpoint.enabled,
        created_at=endpoint.created_at,
    )


@router.post("/webhooks", auth=OPERATE, response=answers({201: CreatedEndpoint}, 404, 422))
def create(request: HttpRequest, endpoint: EndpointIn) -> Status[CreatedEndpoint]:
    try:
        made, secret = create_endpoint(
            endpoint.url,
            states=[state.value for state in endpoint.states],
            tasks=list(endpoint.tasks),
            description=endpoint.description,
        )
    except UnknownTasks as exc:
        raise ApiError(404, str(exc)) from None
    except InvalidEndpoint as exc:
        raise ApiError(422, str(exc)) from None
    return Status(201, CreatedEndpoint(**_out(made).model_dump(), secret=secret))


@router.get("/webhooks", auth=VIEW, response=answers({200: list[EndpointOut]}))
def list_endpoints(request: HttpRequest) -> list[EndpointOut]:
    return [_out(endpoint) for endpoint in WebhookEndpoint.objects.order_by("id")]


@router.delete("/webhooks/{endpoint_id}", auth=OPERATE, response=answers({204: None}, 404, 422))
def delete(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    deleted, _ = WebhookEndpoint.objects.filter(id=endpoint_id).delete()
    if not deleted:
        raise ApiError(404, f"no webhook endpoint {endpoint_id}")
    return HttpResponse(status=204)
