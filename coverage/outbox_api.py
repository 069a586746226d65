"""`/coverage/outbox/dead-letters`: the catalog outbox's dead letters over HTTP, as the console's
Dead letters page lists them (`coverage.dead_letters`), beside the engine's own
(`GET /dead-letters`, which never reads the catalog).

- `GET /coverage/outbox/dead-letters?cursor=&limit=`: the events the dispatcher gave up on,
  newest first, with their count; follow `next_cursor` until it is null.
- `POST /coverage/outbox/dead-letters/redeliver {"ids": [...]}` (operate): back to the queue,
  due now, attempts from zero (`dispatcher.redeliver`), with an outcome per id.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import ConfigDict, StrictInt

from coverage import dispatcher
from coverage.models import EventOutbox
from orchestrator.api.auth import OPERATE, VIEW
from orchestrator.api.errors import answers

router = Router(tags=["coverage"])

MAX_PAGE = 200
MAX_IDS = 200


class DeadEventOut(Schema):
    id: int
    kind: str = Field(description="the catalog change, e.g. item_added")
    item_id: int
    attempts: int
    dead_at: datetime
    last_error: str


class DeadEventPage(Schema):
    items: list[DeadEventOut]
    count: int = Field(description="every dead-lettered event, not only this page's")
    next_cursor: int | None = Field(description="pass as `cursor` for the next page")


class DeadEventFilters(Schema):
    cursor: int | None = Field(None, ge=1, description="next_cursor of the previous page")
    limit: int = Field(50, ge=1, le=MAX_PAGE)


class RedeliverIn(Schema):
    model_config = ConfigDict(extra="forbid")

    ids: list[StrictInt] = Field(min_length=1, max_length=MAX_IDS)


class RedeliveredOut(Schema):
    id: int
    outcome: Literal["redelivered", "not_found"] = Field(
        description="not_found: no such event, or it is not dead-lettered (any more)"
    )


class RedeliverOut(Schema):
    redelivered: int
    items: list[RedeliveredOut]


@router.get("/coverage/outbox/dead-letters", auth=VIEW, response=answers({200: DeadEventPage}, 422))
def dead_events(request: HttpRequest, filters: Query[DeadEventFilters]) -> DeadEventPage:
    """The outbox events that dead-lettered, newest first."""
    dead = EventOutbox.objects.filter(dead_at__isnull=False)
    rows = dead.order_by("-id")
    if filters.cursor is not None:
        rows = rows.filter(id__lt=filters.cursor)
    page = list(rows[: filters.limit + 1])
    more = len(page) > filters.limit
    page = page[: filters.limit]
    return DeadEventPage(
        items=[
            DeadEventOut(
                id=event.id,
                kind=event.kind,
                item_id=event.item_id,
                attempts=event.attempts,
                dead_at=event.dead_at,
                last_error=event.last_error,
            )
            for event in page
            if event.dead_at is not None
        ],
        count=dead.count(),
        next_cursor=page[-1].id if more else None,
    )


@router.post(
    "/coverage/outbox/dead-letters/redeliver",
    auth=OPERATE,
    response=answers({200: RedeliverOut}, 422),
)
def redeliver(request: HttpRequest, body: RedeliverIn) -> RedeliverOut:
    """Dead-lettered events back to the queue, due now, attempts from zero."""
    wanted = list(dict.fromkeys(body.ids))
    dead = set(
        EventOutbox.objects.filter(id__in=wanted, dead_at__isnull=False).values_list(
            "id", flat=True
        )
    )
    count = dispatcher.redeliver(sorted(dead))
    return RedeliverOut(
        redelivered=count,
        items=[
            RedeliveredOut(id=i, outcome="redelivered" if i in dead else "not_found")
            for i in wanted
        ],
    )
