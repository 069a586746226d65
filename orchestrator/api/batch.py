"""`POST /runs:batch`: up to 1,000 starts in one call (`runs.batch.start_runs`), each answered.

Each start is judged as `POST /runs` would judge it, and its outcome comes back in the order
sent: started, joined (with the live run's id), debounced (with the waiting run's id), coalesced
(with the follow-up's id), throttled
(with the run met and `next_start_at`), dropped, refused (with the status `POST /runs` would
have answered, its code and detail, and field errors for an invalid input), or not_started. With
`atomic: true` a single refusal writes nothing and answers 409, listing in `errors` every start
that was refused and why.
"""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import ConfigDict, StrictBool

from orchestrator.api.auth import OPERATE, current_user
from orchestrator.api.errors import ApiError, FieldErrorOut, answers
from orchestrator.api.starting import StartRunIn
from orchestrator.runs.batch import MAX_BATCH, Outcome, Result, start_runs
from orchestrator.runs.batches import StartRequest
from orchestrator.triggers import TriggerKind

router = Router(tags=["runs"])


class BatchIn(Schema):
    model_config = ConfigDict(extra="forbid")

    runs: list[StartRunIn] = Field(
        min_length=1, max_length=MAX_BATCH, description=f"the starts, at most {MAX_BATCH}"
    )
    atomic: StrictBool = Field(
        default=False,
        description="all or nothing: one refusal writes nothing and answers 409",
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
    items: list[BatchItemOut]
    counts: dict[Result, int] = Field(description="how many starts had each result")


@router.post("/runs:batch", auth=OPERATE, response=answers({200: BatchOut}, 409, 422))
def create_runs(request: HttpRequest, batch: BatchIn) -> BatchOut:
    """Start many runs in one call: one INSERT, one publish; each start's outcome answered."""
    trigger = {"kind": TriggerKind.API.value, "actor": current_user(request).username}
    outcomes = start_runs(
        [
            StartRequest(
                run.task,
                run.input,
                trigger=trigger,
                priority=run.priority,
                idempotency_key=run.idempotency_key,
                not_before=run.delay(),
            )
            for run in batch.runs
        ],
        atomic=batch.atomic,
    )
    items = [_item(index, outcome) for index, outcome in enumerate(outcomes)]
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
    return BatchOut(items=items, counts=counts)


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
