"""What starting a run takes and answers over the API, wherever it is started: the start's body
(`POST /runs`, each start of `POST /runs:batch`), the answer with the run, and `start_run`'s
refusals as API errors (a new run, an operator's retry, an inbound trigger's run, a rescan)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any

from ninja import Field, Schema
from ninja.responses import Status
from pydantic import (
    AwareDatetime,
    BeforeValidator,
    ConfigDict,
    StrictFloat,
    StringConstraints,
    field_validator,
    model_validator,
)

from orchestrator.api.errors import ApiError
from orchestrator.api.fields import PriorityIn, Storable, StorableStr
from orchestrator.hooks.base import Refused
from orchestrator.models import TaskHistory
from orchestrator.runs import tags
from orchestrator.runs.handle import InvalidInput, KeyContended, RunHandle, StartRefused
from orchestrator.runs.rerun import NotRetryable
from orchestrator.runs.start import MAX_IDEMPOTENCY_KEY
from orchestrator.states import RunState
from tasks.registry import UnknownTaskError


def _rfc3339_text(value: object) -> object:
    # pydantic would also read a number as seconds since the epoch, which the schema's
    # `date-time` string does not allow.
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 time, as a string")
    return value


TimeText = Annotated[AwareDatetime, BeforeValidator(_rfc3339_text)]
# Only so no number overflows a timedelta: LUMASTRA_MAX_START_DELAY_S is the real bound.
MAX_DELAY_S = 100 * 365 * 86400
IdempotencyKey = Annotated[str, StringConstraints(max_length=MAX_IDEMPOTENCY_KEY), Storable()]
Tag = Annotated[str, StringConstraints(pattern=tags.TAG_PATTERN, max_length=tags.MAX_TAG_CHARS)]


class StartRunIn(Schema):
    # The schema says what `_one_delay` checks, so a client generated from it knows.
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"not": {"required": ["not_before", "delay_s"]}}
    )

    task: StorableStr = Field(description="a task id from GET /tasks")
    input: dict[str, Any] = Field(
        default_factory=dict, description="validated against the task's input schema"
    )
    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        description="while a run with this key is live, starting again returns that run; "
        "an empty or blank key is no key (no deduplication)",
    )
    priority: PriorityIn | None = Field(
        default=None, description="1 most urgent … 7 least; default: the task's, else 2"
    )
    not_before: TimeText | None = Field(
        default=None,
        description="a delayed start: the run waits `pending` until this time (RFC 3339, with "
        "its offset); a time already past starts now; at most LUMASTRA_MAX_START_DELAY_S ahead",
    )
    delay_s: StrictFloat | None = Field(
        default=None,
        ge=0,
        le=MAX_DELAY_S,
        allow_inf_nan=False,
        description="a delayed start, in seconds from now (or `not_before`)",
    )
    tags: list[Tag] = Field(
        default_factory=list,
        max_length=tags.MAX_TAGS,
        description="what else the run is about, to find it by (`GET /runs?tag=`); a retry "
        "keeps them",
    )

    @model_validator(mode="after")
    def _one_delay(self) -> StartRunIn:
        if {"not_before", "delay_s"} <= self.model_fields_set:
            raise ValueError("give not_before or delay_s, not both")
        return self

    def delay(self) -> datetime | timedelta | None:
        """What `start_run` takes as `not_before`."""
        if self.delay_s is not None:
            return timedelta(seconds=self.delay_s)
        return self.not_before

    @field_validator("idempotency_key")
    @classmethod
    def _blank_is_absent(cls, key: str | None) -> str | None:
        # A client that always sends the field, empty when it has no key, gets no dedup
        # rather than a refusal (or, worse, every such start sharing the key "").
        if key is not None and not key.strip():
            return None
        return key


class StartedRun(Schema):
    run_id: str
    task: str
    state: RunState
    priority: int
    job_id: str
    deduplicated: bool = Field(
        description="true when a live run with this idempotency key or identity was returned"
    )
    dropped: bool = Field(
        description="true when the task's queue was full and its backpressure policy is "
        "`drop`: the run is recorded as cancelled (error kind `dropped`) and never enqueued"
    )
    outcome: str = Field(
        description="started (a new run), deduplicated (a live run already does this work), "
        "debounced (a debounced task's start gave its input to the waiting run of its "
        "identity, due later), coalesced (a follow-up task's start met the running run of its "
        "identity: the follow-up that starts when that run ends, recorded or given this input), "
        "throttled (its identity made a run this period: that run), or dropped"
    )
    next_start_at: datetime | None = Field(
        None, description="throttled: when the next start of this identity may make a run"
    )
    result: Any = Field(None, description="with `wait`: the run's result once it completed")
    error: dict[str, Any] | None = Field(
        None, description="with `wait`: the run's error once it failed or was cancelled"
    )


@contextmanager
def start_refusals(input_at: tuple[str, ...] = ("body", "run", "input")) -> Iterator[None]:
    """start_run's refusals as API errors (a new run, an operator's retry, a trigger's run);
    an invalid input's field errors located at `input_at`."""
    try:
        yield
    except UnknownTaskError as exc:
        raise ApiError(404, str(exc)) from None
    except InvalidInput as exc:
        # Located like ninja's own body errors: source, then the view's parameter name.
        errors = [{**e, "loc": [*input_at, *e["loc"]]} for e in exc.errors]
        raise ApiError(422, f"input is invalid for task {exc.task_id!r}", errors) from None
    except (NotRetryable, KeyContended) as exc:
        raise ApiError(409, str(exc)) from None
    except StartRefused as exc:
        raise ApiError(422, str(exc)) from None
    except Refused as exc:
        raise ApiError(
            exc.http_status, str(exc), code=exc.code, retry_after=exc.retry_after
        ) from None


def answered(handle: RunHandle) -> Status[StartedRun]:
    """A start's answer: 202 with a new run; 200 with the live run that already does this
    work, or with the recorded run backpressure dropped."""
    if handle.dropped:
        return Status(200, started(handle, RunState.CANCELLED))
    if handle.deduplicated or handle.debounced or handle.coalesced:
        # The matched run's row may not be committed yet; until it is, it is still pending.
        state = TaskHistory.objects.filter(id=handle.run_id).values_list("state", flat=True)
        return Status(200, started(handle, state.first() or RunState.PENDING))
    return Status(202, started(handle, RunState.PENDING))


def started(
    handle: RunHandle, state: str, *, result: Any = None, error: dict[str, Any] | None = None
) -> StartedRun:
    return StartedRun(
        run_id=handle.run_id,
        task=handle.task_id,
        state=RunState(state),
        priority=handle.priority,
        job_id=handle.job_id,
        deduplicated=handle.deduplicated,
        dropped=handle.dropped,
        outcome=handle.outcome,
        next_start_at=handle.next_start_at,
        result=result,
        error=error,
    )
