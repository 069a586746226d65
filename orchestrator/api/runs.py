"""`/runs`: start a run, read one run (durable row plus live state) or its Markdown report,
list runs, cancel one (or kill it now: `{"kill": true}`), retry one (a pipeline resumed or
started afresh: `{"mode": "resume" | "fresh"}`). The bodies are optional: without one, a cancel
is cooperative and a retry resumes a pipeline, as before they existed.

Views never write run state: a run is started only through `start_run`, whose refusals
(unknown task, invalid input, admission: quota, exclusivity) leave nothing written.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Schema
from ninja.responses import Status
from pydantic import (
    BeforeValidator,
    ConfigDict,
    StrictBool,
    WithJsonSchema,
)

from orchestrator.api import report
from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.pagination import Position, page
from orchestrator.api.run_search import FilterIn, query_filter
from orchestrator.api.starting import StartedRun, StartRunIn, answered, start_refusals, started
from orchestrator.models import TaskHistory
from orchestrator.recovery import windows
from orchestrator.runs import search
from orchestrator.runs.cancel import NotCancellable, UnknownRun, request_cancel
from orchestrator.runs.children import batches_of
from orchestrator.runs.rerun import rerun
from orchestrator.runs.start import start_run
from orchestrator.runs.wait import ended
from orchestrator.states import RunState
from orchestrator.stores import live
from orchestrator.text import is_run_id
from orchestrator.triggers import TriggerKind

router = Router(tags=["runs"])
# The longest `POST /runs?wait=` holds a request (and a worker thread of the web role).
MAX_WAIT_S = 60

MAX_PAGE = 200


class WaitIn(Schema):
    wait: float | None = Field(
        None,
        gt=0,
        le=MAX_WAIT_S,
        description="seconds to wait for the run to end before answering 202",
    )


class Progress(Schema):
    done: float
    total: float | None
    item: str | None = Field(None, description="what the handler reported working on")
    rate: float | None = Field(None, description="done per second, smoothed")
    eta_s: float | None = Field(None, description="seconds left at that rate (with a total)")
    at: datetime | None = Field(None, description="when this report was written")


class RunSummary(Schema):
    run_id: str
    task: str
    state: RunState
    priority: int
    trigger: dict[str, Any]
    tags: list[str] = Field(description="given at start: `GET /runs?tag=` finds it")
    parent_run_id: str | None = Field(description="the run whose step spawned it (`ctx.spawn`)")
    batch_id: str | None = Field(description="the batch it belongs to: GET /batches/{id}")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    not_before: datetime | None = Field(
        description="scheduled for: while a delayed start waits, or a retry waits its backoff"
    )
    progress: Progress | None = Field(
        description="the latest progress: live while the run runs, else as its row kept it"
    )


class LiveState(Schema):
    """What Valkey holds now; may be ahead of the row while a run is in flight."""

    state: str
    owner: str
    progress: Progress | None
    stages: dict[str, str]
    updated_at: datetime | None


class HeldOut(Schema):
    by: str = Field(description="pause, window, debounce, follow_up, concurrency or limit")
    scope: str = Field(description="task or class; run; key (concurrency); limit")
    name: str = Field(description="the task id or the resource class; the run followed up; the key")
    opens_at: datetime | None = Field(
        None, description="a window: when it opens; a debounce: when the run is due"
    )
    tz: str | None = Field(None, description="the zone opens_at is told in")
    says: str = Field(description='for people: "waits for window (opens 01:00 Europe/Berlin)"')


def _held(row: TaskHistory) -> HeldOut | None:
    if row.state != RunState.PENDING:
        return None
    hold = windows.held(row)
    if hold is None:
        return None
    return HeldOut(**dataclasses.asdict(hold), says=hold.describe())


class ChildBatchOut(Schema):
    batch_id: str
    stage: str = Field(description="the stage that spawned them ('' for a plain run)")
    total: int
    ended: int
    counts: dict[str, int] = Field(description="the ended ones by state")
    says: str = Field(description='for people: "412 of 500 done"')


class RunDetail(RunSummary):
    input: dict[str, Any]
    result: Any
    error: dict[str, Any] | None
    attempts: int
    processing_version: int
    duration_s: float | None
    stages: dict[str, str] = Field(description="a pipeline run's stages and their states")
    steps: list[dict[str, Any]] = Field(
        description="what each step did: status, timings, attempts, cost, counters, warnings, "
        "error (a pipeline run: one per stage; any other run: one)"
    )
    cost: dict[str, float] = Field(description="units spent by kind (`ctx.spend`)")
    live: LiveState | None = Field(description="null once the live hash has expired")
    held: HeldOut | None = Field(
        None, description="a pending run a pause, a closed run window or its debounce holds"
    )
    children: list[ChildBatchOut] = Field(
        description="the batches of children its steps spawned, with their progress"
    )


def _decode_cursor(value: object) -> object:
    return Position.decode(value) if isinstance(value, str) else value


Cursor = Annotated[
    Position | None,
    BeforeValidator(_decode_cursor),
    WithJsonSchema({"type": "string", "description": "next_cursor of the previous page"}),
]


class RunFilters(FilterIn):
    cursor: Cursor = None
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)


class RunPage(Schema):
    items: list[RunSummary]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


# A start can be refused by admission: 409 (exclusivity), 429 (quota), 503 (circuit open,
# queue full).
@router.post(
    "/runs", auth=OPERATE, response=answers({200: StartedRun, 202: StartedRun}, 404, 409, 422, 503)
)
def create_run(request: HttpRequest, run: StartRunIn, wait: Query[WaitIn]) -> Status[StartedRun]:
    """Start a run: 202 with the new run; 200 with a live run that already does this work, or
    with the recorded run when backpressure dropped the start. With `wait=N` (seconds, at
    most 60): 200 with the run's end (`state`, `result`, `error`) when
    it ends within N seconds, else the usual 202 (the run goes on)."""
    with start_refusals():
        handle = start_run(
            run.task,
            run.input,
            trigger={"kind": TriggerKind.API.value, "actor": current_user(request).username},
            priority=run.priority,
            idempotency_key=run.idempotency_key,
            not_before=run.delay(),
            tags=run.tags,
        )
    if wait.wait and not handle.dropped:
        row = ended(handle.run_id, wait.wait)
        if row is not None:
            return Status(200, started(handle, row.state, result=row.result, error=row.error))
    return answered(handle)


class CancelledRun(Schema):
    run_id: str
    state: RunState = Field(
        description="cancelled when the run had not started; cancelling while its handler "
        "is told to stop (it is killed if it does not within LUMASTRA_CANCEL_ESCALATE_S)"
    )


class CancelIn(Schema):
    model_config = ConfigDict(extra="forbid")

    kill: StrictBool = Field(
        default=False,
        description="kill now: a running handler is not waited for; its run ends cancelled and "
        "its process is killed as soon as its worker hears (also for a run already cancelling)",
    )


@router.post(
    "/runs/{run_id}/cancel", auth=OPERATE, response=answers({200: CancelledRun}, 404, 409, 422)
)
def cancel_run(request: HttpRequest, run_id: str, options: CancelIn | None = None) -> CancelledRun:
    """Cancel a run: at once if it has not started, cooperatively if it is running, or with
    `{"kill": true}` without waiting for its handler. No body: a cooperative cancel."""
    _require_run_id(run_id)
    kill = options is not None and options.kill
    try:
        state = request_cancel(run_id, actor=current_user(request).username, kill=kill)
    except UnknownRun as exc:
        raise ApiError(404, str(exc)) from None
    except NotCancellable as exc:
        raise ApiError(409, str(exc)) from None
    return CancelledRun(run_id=run_id, state=state)


class RetryMode(StrEnum):
    RESUME = "resume"  # a pipeline's new run reuses the stages the original completed
    FRESH = "fresh"  # the new run runs every stage again


class RetryIn(Schema):
    model_config = ConfigDict(extra="forbid")

    mode: RetryMode | None = Field(
        default=None,
        description="resume: a pipeline run's new run reuses the stages the original completed "
        "(409 for a task that is not a pipeline); fresh: every stage runs again; absent: "
        "resume a pipeline, rerun anything else",
    )


@router.post(
    "/runs/{run_id}/retry",
    auth=OPERATE,
    response=answers({200: StartedRun, 202: StartedRun}, 404, 409, 422, 503),
)
def retry(request: HttpRequest, run_id: str, options: RetryIn | None = None) -> Status[StartedRun]:
    """Retry a failed or cancelled run: a new run at priority 1 whose trigger names it; a
    pipeline is resumed unless `{"mode": "fresh"}`."""
    _require_run_id(run_id)
    mode = options.mode if options is not None else None
    reuse = None if mode is None else mode is RetryMode.RESUME
    with start_refusals():
        try:
            handle = rerun(run_id, actor=current_user(request).username, reuse=reuse)
        except UnknownRun as exc:
            raise ApiError(404, str(exc)) from None
    status = 200 if handle.deduplicated else 202
    return Status(status, started(handle, RunState.PENDING))


def _require_run_id(run_id: str) -> None:
    # Any other text names no run; refusing it here keeps it from the database, which cannot
    # take some of it (NUL) at all.
    if not is_run_id(run_id):
        raise ApiError(404, str(UnknownRun(run_id)))


@router.get("/runs/{run_id}", auth=VIEW, response=answers({200: RunDetail}, 404))
def get_run(request: HttpRequest, run_id: str) -> RunDetail:
    _require_run_id(run_id)
    row = TaskHistory.objects.filter(id=run_id).first()
    if row is None:
        raise ApiError(404, f"no run {run_id!r}")
    found = live.read(row.id)
    return RunDetail(
        **_summary(row, found.get("progress")).model_dump(),
        input=row.input,
        result=row.result,
        error=row.error,
        attempts=row.attempts,
        processing_version=row.processing_version,
        duration_s=row.duration_s,
        stages=row.stages,
        steps=report.step_records(row),
        cost=row.cost_breakdown,
        live=_live_state(found),
        held=_held(row),
        children=[
            ChildBatchOut(**dataclasses.asdict(batch), says=batch.says)
            for batch in batches_of(row.id)
        ],
    )


@router.get(
    "/runs/{run_id}/report.md",
    auth=VIEW,
    response=answers({200: str}, 404),
    openapi_extra={"responses": {"200": {"content": {"text/markdown": {}}}}},
)
def run_report(request: HttpRequest, run_id: str) -> HttpResponse:
    """The run as Markdown: YAML frontmatter (the run, `steps:`), then a table of its steps,
    its error and its warnings."""
    _require_run_id(run_id)
    row = TaskHistory.objects.filter(id=run_id).first()
    if row is None:
        raise ApiError(404, f"no run {run_id!r}")
    return HttpResponse(report.render(row), content_type="text/markdown; charset=utf-8")


@router.get("/runs", auth=VIEW, response=answers({200: RunPage}, 422))
def list_runs(request: HttpRequest, filters: Query[RunFilters]) -> RunPage:
    """Newest first; follow `next_cursor` until it is null. `input.<field>=<value>` (any
    number of times, at most 10 fields) keeps the runs whose input's top-level field equals
    the value: the JSON it reads as, or the text (`input.library_id=7` finds 7 and "7")."""
    runs = search.matching(query_filter(request, filters))
    rows, next_position = page(runs, filters.cursor, filters.limit)
    # The running runs' progress from their live hashes, fresher than their rows: one round trip.
    running = [row.id for row in rows if row.state == RunState.ACTIVE]
    fresh = dict(zip(running, live.progress_of(running), strict=True)) if running else {}
    return RunPage(
        items=[_summary(row, fresh.get(row.id)) for row in rows],
        next_cursor=next_position.encode() if next_position else None,
    )


def _summary(row: TaskHistory, live_progress: str | None = None) -> RunSummary:
    progress = json.loads(live_progress) if live_progress else row.progress
    return RunSummary(
        run_id=row.id,
        task=row.task_id,
        state=RunState(row.state),
        priority=row.priority,
        trigger=row.trigger,
        tags=row.tags,
        parent_run_id=row.parent_run_id,
        batch_id=row.batch_id,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        not_before=row.not_before if row.state == RunState.PENDING else None,
        progress=progress_report(progress),
    )


def progress_report(document: Any) -> Progress | None:
    """A progress document (the live hash's, or the row's) as the API shows it."""
    if not isinstance(document, dict) or "done" not in document:
        return None
    return Progress.model_validate(
        {k: v for k, v in document.items() if k in Progress.model_fields}
    )


def _live_state(found: live.RunHash) -> LiveState | None:
    if not found:
        return None
    progress = found.get("progress")
    updated_ms = found.get("updated_at")
    return LiveState(
        state=found["state"],
        owner=found.get("owner", ""),
        progress=progress_report(json.loads(progress)) if progress else None,
        stages={
            name.removeprefix("stage:"): str(value)
            for name, value in found.items()
            if name.startswith("stage:")
        },
        updated_at=datetime.fromtimestamp(int(updated_ms) / 1000, UTC) if updated_ms else None,
    )
