"""`POST /runs:batch`: up to 1,000 starts in one call (`runs.batch.start_runs`), each answered;
`GET /batches/{id}`: a batch's runs by state and its callbacks' runs.

Each start is judged as `POST /runs` would judge it, and its outcome comes back in the order
sent: started, joined (with the live run's id), debounced (with the waiting run's id), coalesced
(with the follow-up's id), throttled
(with the run met and `next_start_at`), dropped, refused (with the status `POST /runs` would
have answered, its code and detail, and field errors for an invalid input), or not_started. With
`atomic: true` a single refusal writes nothing and answers 409, listing in `errors` every start
that was refused and why.

With `batch: {"on_complete": {...}, "on_success": {...}}` the runs it records are one batch
(`batch_id` in the answer, `GET /batches/{id}`): once every one has ended, `on_complete` starts
once, its input given `batch_id` and `counts` (the runs by end state); `on_success` too, only
when all completed. A callback that could not start so is refused before anything is written.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.db.models import Count
from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import ConfigDict, StrictBool

from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, FieldErrorOut, answers
from orchestrator.api.starting import StartRunIn, start_refusals
from orchestrator.models import RunBatch, TaskHistory
from orchestrator.runs.batch import MAX_BATCH, Outcome, Result, start_runs
from orchestrator.runs.batches import Batch, StartRequest, check_callback
from orchestrator.triggers import TriggerKind

router = Router(tags=["runs"])


class CallbackIn(Schema):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(max_length=64, description="the callback's task")
    input: dict[str, Any] = Field(
        default_factory=dict, description="its input, given `batch_id` and `counts` too"
    )
    priority: int | None = None


class CallbacksIn(Schema):
    model_config = ConfigDict(extra="forbid")

    on_complete: CallbackIn | None = Field(None, description="started once every run ended")
    on_success: CallbackIn | None = Field(None, description="started if every run completed")


class BatchIn(Schema):
    model_config = ConfigDict(extra="forbid")

    runs: list[StartRunIn] = Field(
        min_length=1, max_length=MAX_BATCH, description=f"the starts, at most {MAX_BATCH}"
    )
    atomic: StrictBool = Field(
        default=False,
        description="all or nothing: one refusal writes nothing and answers 409",
    )
    batch: CallbacksIn | None = Field(
        None, description="the runs are one batch, with callbacks once all have ended"
    )


class BatchItemOut(Schema):
    index: int = Field(description="the start's place in `runs`")
    result: Result
    run_id: str | None = Field(None, description="the new run, or the live run joined")
    priority: int | None = None
    status: int | None = Field(None, description="a refusal: what POST /runs would answer")
    code: str | None = Field(None, description="a refusal's stable code")
    detail: str | None = None
    errors: list[FieldErrorOut] = Field(default_factory=list, description="invalid input")
    next_start_at: datetime | None = Field(
        None, description="throttled: when the next start of this identity may make a run"
    )


class BatchOut(Schema):
    batch_id: str | None = Field(None, description="with `batch`: GET /batches/{id}")
    items: list[BatchItemOut]
    counts: dict[Result, int] = Field(description="how many starts had each result")


@router.post("/runs:batch", auth=OPERATE, response=answers({200: BatchOut}, 404, 409, 422))
def create_runs(request: HttpRequest, batch: BatchIn) -> BatchOut:
    """Start many runs in one call: one INSERT, one publish; each start's outcome answered."""
    trigger = {"kind": TriggerKind.API.value, "actor": current_user(request).username}
    callbacks = None
    if batch.batch is not None:
        callbacks = Batch(
            on_complete=_callback(batch.batch.on_complete, trigger),
            on_success=_callback(batch.batch.on_success, trigger),
        )
        for name in ("on_complete", "on_success"):
            if (request := getattr(callbacks, name)) is not None:
                with start_refusals(("body", "batch", "batch", name, "input")):
                    check_callback(request)
    outcomes = _started(batch, trigger, callbacks)
    items = [_item(index, outcome) for index, outcome in enumerate(outcomes)]
    return _answered(batch, items, callbacks)


def _started(batch: BatchIn, trigger: dict[str, Any], callbacks: Batch | None) -> list[Outcome]:
    return start_runs(
        [
            StartRequest(
                run.task,
                run.input,
                trigger=trigger,
                priority=run.priority,
                idempotency_key=run.idempotency_key,
                not_before=run.delay(),
                tags=tuple(run.tags),
            )
            for run in batch.runs
        ],
        atomic=batch.atomic,
        batch=callbacks,
    )


def _callback(callback: CallbackIn | None, trigger: dict[str, Any]) -> StartRequest | None:
    if callback is None:
        return None
    return StartRequest(callback.task, callback.input, trigger=trigger, priority=callback.priority)


def _answered(batch: BatchIn, items: list[BatchItemOut], callbacks: Batch | None) -> BatchOut:
    if batch.atomic and any(item.result is Result.REFUSED for item in items):
        refused = [item for item in items if item.result is Result.REFUSED]
        raise ApiError(
            409,
            f"the batch was not started: {len(refused)} of its starts were refused",
            [
                {
                    "loc": ["body", "batch", "runs", item.index],
                    "msg": item.detail or "",
                    "type": item.code or "",
                }
                for item in refused
            ],
            code="batch_refused",
        )
    counts = {result: 0 for result in Result}
    for item in items:
        counts[item.result] += 1
    return BatchOut(batch_id=callbacks.id if callbacks else None, items=items, counts=counts)


class BatchStateOut(Schema):
    id: str
    parent_run_id: str | None = Field(description="the run whose step spawned it, if any")
    parent_stage: str = Field(description="that step's stage ('' for a plain run)")
    on_failure: str = Field(description="fail_parent or continue (a spawn's)")
    total: int = Field(description="the runs it recorded")
    ended: int
    by_state: dict[str, int] = Field(description="its runs by their state now")
    callbacks: dict[str, Any] = Field(
        description="on_complete / on_success: the run each became, once started"
    )
    created_at: datetime
    done_at: datetime | None = Field(description="when its last run ended")


@router.get("/batches/{batch_id}", auth=VIEW, response=answers({200: BatchStateOut}, 404))
def get_batch(request: HttpRequest, batch_id: str) -> BatchStateOut:
    """A batch of runs (a caller's `batch`, or a step's children): its runs by state."""
    row = RunBatch.objects.filter(id=batch_id[:40]).first() if _BATCH_ID.match(batch_id) else None
    if row is None:
        raise ApiError(404, f"no batch {batch_id!r}")
    by_state: dict[str, int] = dict(
        TaskHistory.objects.filter(batch_id=row.id)
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    # A resume's batch keeps completed runs of the batches it reuses, counted in its total.
    if kept := row.total - sum(by_state.values()):
        by_state["completed"] = by_state.get("completed", 0) + kept
    return BatchStateOut(
        id=row.id,
        parent_run_id=row.parent_run_id,
        parent_stage=row.parent_stage,
        on_failure=row.on_failure,
        total=row.total,
        ended=row.total - row.open,
        by_state=by_state,
        callbacks=row.callbacks,
        created_at=row.created_at,
        done_at=row.done_at,
    )


_BATCH_ID = re.compile(r"^batch_[0-9A-HJKMNP-TV-Z]{26}$")


def _item(index: int, outcome: Outcome) -> BatchItemOut:
    return BatchItemOut(
        index=index,
        result=outcome.result,
        run_id=outcome.run_id,
        priority=outcome.priority,
        status=outcome.http_status,
        code=outcome.code,
        detail=outcome.detail,
        next_start_at=outcome.next_start_at,
        errors=[
            FieldErrorOut(
                loc=["body", "batch", "runs", index, "input", *e["loc"]],
                msg=e["msg"],
                type=e.get("type", ""),
            )
            for e in outcome.errors
        ],
    )
