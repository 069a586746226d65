"""`/coverage`: the per-item backlog over HTTP (mounted on the v1 API by `lumastra.urls`).

- `GET /coverage`: per stage, counts per status and the oldest waiting row.
- `GET /coverage/{stage}?status=…`: the stage's rows with their items, reasons and last
  errors, in pages (follow `next_cursor`).
- `POST /coverage/{stage}/items/{item}/rescan` (operate): the item's run now.
- `POST /coverage/{stage}/heal` (operate): the stage's skipped rows looked at again now.
- `POST /catalog/rescan {"path"}` (operate): a folder of a media root synced with the disk now
  (`coverage.library`), as the file watcher does when files change.

Views never write rows: they call `coverage.backlog`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.responses import Status

from coverage import backlog, library
from coverage.models import CoverageStatus
from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.fields import StorableStr
from orchestrator.api.starting import StartedRun, answered, start_refusals, started
from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind

router = Router(tags=["coverage"])


class StageOut(Schema):
    stage: str
    task: str = Field(description="the task that covers it")
    applies_to: list[str]
    enqueueable: bool
    driven: bool = Field(description="the stage-sweep starts its runs")
    counts: dict[str, int] = Field(description="rows per status")
    total: int
    oldest_waiting_at: datetime | None = Field(
        description="`next_eligible_at` of its oldest row waiting for a run"
    )
    oldest_waiting_age_s: float | None
    last_tick: dict[str, Any] = Field(description="what the last sweep tick did for it")


class RowOut(Schema):
    item_id: int
    kind: str
    title: str
    status: CoverageStatus
    reason: str
    last_error: str
    failures: int
    run_id: str
    processing_version: int | None
    next_eligible_at: datetime
    updated_at: datetime


class RowPage(Schema):
    stage: str
    items: list[RowOut]
    next_cursor: int | None = Field(description="pass as `cursor` for the next page")


class RowFilters(Schema):
    status: CoverageStatus | None = None
    cursor: int = Field(0, ge=0)
    limit: int = Field(50, ge=1, le=500)


class Healed(Schema):
    stage: str
    healed: int


@router.get("/coverage", auth=VIEW, response=answers({200: list[StageOut]}))
def list_stages(request: HttpRequest) -> list[StageOut]:
    now = datetime.now(UTC)
    return [
        StageOut(
            stage=b.stage,
            task=b.task_id,
            applies_to=list(b.applies_to),
            enqueueable=b.enqueueable,
            driven=b.driven,
            counts=b.counts,
            total=b.total,
            oldest_waiting_at=b.oldest_due_at,
            oldest_waiting_age_s=(
                None if b.oldest_due_at is None else (now - b.oldest_due_at).total_seconds()
            ),
            last_tick=b.last_tick,
        )
        for b in backlog.overview()
    ]


@router.get("/coverage/{stage}", auth=VIEW, response=answers({200: RowPage}, 404, 422))
def list_rows(request: HttpRequest, stage: str, filters: Query[RowFilters]) -> RowPage:
    try:
        found, next_cursor = backlog.rows(stage, filters.status, filters.cursor, filters.limit)
    except backlog.UnknownStage as exc:
        raise ApiError(404, str(exc)) from None
    return RowPage(
        stage=stage,
        items=[
            RowOut(
                item_id=row.item_id,
                kind=row.item.kind,
                title=row.item.title,
                status=CoverageStatus(row.status),
                reason=row.reason,
                last_error=row.last_error,
                failures=row.failures,
                run_id=row.run_id,
                processing_version=row.processing_version,
                next_eligible_at=row.next_eligible_at,
                updated_at=row.updated_at,
            )
            for row in found
        ],
        next_cursor=next_cursor,
    )


@router.post(
    "/coverage/{stage}/items/{item_id}/rescan",
    auth=OPERATE,
    response=answers({200: StartedRun, 202: StartedRun}, 404, 409, 422, 503),
)
def rescan(request: HttpRequest, stage: str, item_id: int) -> Status[StartedRun]:
    """Process the item for the stage now (priority 2): 202 with the new run, 200 with the live
    run that already does it (or the recorded run its full queue dropped); 409 when the item
    is not of the stage's kinds or not eligible, or when the stage's one batch run is busy
    with other items (the item then goes first in the next batch)."""
    trigger = {"kind": TriggerKind.API.value, "actor": current_user(request).username}
    with start_refusals():
        try:
            handle = backlog.rescan(stage, item_id, trigger)
        except (backlog.UnknownStage, backlog.UnknownItem) as exc:
            raise ApiError(404, str(exc)) from None
        except backlog.NotCovered as exc:
            raise ApiError(409, str(exc)) from None
    if handle.dropped:
        return Status(200, started(handle, RunState.CANCELLED))
    if handle.deduplicated:
        state = TaskHistory.objects.filter(id=handle.run_id).values_list("state", flat=True)
        return Status(200, started(handle, state.first() or RunState.PENDING))
    return Status(202, started(handle, RunState.PENDING))


@router.post("/coverage/{stage}/heal", auth=OPERATE, response=answers({200: Healed}, 404))
def heal(request: HttpRequest, stage: str) -> Healed:
    """Every row of the stage skipped as ineligible (or for a reason the stage lists) whose
    condition holds again becomes pending now."""
    try:
        return Healed(stage=stage, healed=backlog.heal(stage))
    except backlog.UnknownStage as exc:
        raise ApiError(404, str(exc)) from None


class RescanIn(Schema):
    path: StorableStr = Field(
        max_length=1000,
        description="a folder inside a media root (LUMASTRA_MEDIA_ROOTS), or a root",
    )


@router.post(
    "/catalog/rescan",
    auth=OPERATE,
    response=answers({200: StartedRun, 202: StartedRun}, 409, 422),
)
def rescan_folder(request: HttpRequest, body: RescanIn) -> Status[StartedRun]:
    """Sync the catalog's files below the folder with the disk now (priority 2): 202 with the
    new `catalog-rescan` run, 200 with the one already queued or running for that folder; 422
    for a path outside the media roots."""
    trigger = {"kind": TriggerKind.API.value, "actor": current_user(request).username}
    with start_refusals():
        try:
            handle = library.start_rescan(body.path, trigger)
        except library.OutsideRoots as exc:
            where = {"loc": ["body", "body", "path"], "msg": str(exc), "type": "value_error"}
            raise ApiError(422, str(exc), [where]) from None
    return answered(handle)
