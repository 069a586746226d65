"""Pause and resume a task or a resource class, cluster-wide (issue 27): `POST
/tasks/{id}/pause`, `…/resume`, `POST /classes/{class}/pause`, `…/resume`, and `GET /pauses`.

Views never write state: `recovery.pauses` does, under the caller's name. A paused run stays
`pending` (parked once a worker took its message); running runs finish; a resume publishes
the held runs, most urgent first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import ConfigDict, StringConstraints

from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.fields import Storable
from orchestrator.models import PauseScope, TaskPause
from orchestrator.recovery import pauses
from orchestrator.recovery.pauses import AlreadyPaused, NotPaused, UnknownScope

router = Router(tags=["pauses"])

MAX_REASON = 500
Reason = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON), Storable()]


class PauseIn(Schema):
    model_config = ConfigDict(extra="forbid")

    reason: Reason = Field(description="why, shown to operators beside the pause")
    refuse_starts: bool = Field(
        False,
        description="true: new starts are refused (503 `paused`) while paused; "
        "false: they are taken and wait, pending, with the rest",
    )


class PauseOut(Schema):
    scope: PauseScope
    name: str = Field(description="the task id, or the resource class")
    refuse_starts: bool
    reason: str
    paused_by: str
    paused_at: datetime
    resumed_by: str | None = None
    resumed_at: datetime | None = None
    released: int | None = Field(
        None, description="on resume: the held runs published again, most urgent first"
    )


def _out(row: TaskPause, released: int | None = None) -> PauseOut:
    return PauseOut(
        scope=PauseScope(row.scope),
        name=row.name,
        refuse_starts=row.refuse_starts,
        reason=row.reason,
        paused_by=row.paused_by,
        paused_at=row.paused_at,
        resumed_by=row.resumed_by or None,
        resumed_at=row.resumed_at,
        released=released,
    )


def _pause(request: HttpRequest, scope: PauseScope, name: str, body: PauseIn) -> PauseOut:
    try:
        row = pauses.pause(
            scope,
            name,
            by=current_user(request).username,
            reason=body.reason,
            refuse_starts=body.refuse_starts,
        )
    except UnknownScope as exc:
        raise ApiError(404, str(exc)) from None
    except AlreadyPaused as exc:
        raise ApiError(409, str(exc), code=exc.code) from None
    return _out(row)


def _resume(request: HttpRequest, scope: PauseScope, name: str) -> PauseOut:
    try:
        resumed = pauses.resume(scope, name, by=current_user(request).username)
    except UnknownScope as exc:
        raise ApiError(404, str(exc)) from None
    except NotPaused as exc:
        raise ApiError(409, str(exc), code=exc.code) from None
    return _out(resumed.pause, resumed.released)


PAUSED = answers({200: PauseOut}, 404, 409, 422)
RESUMED = answers({200: PauseOut}, 404, 409)


@router.get("/pauses", auth=VIEW, response=answers({200: list[PauseOut]}))
def list_pauses(request: HttpRequest) -> list[PauseOut]:
    """The pauses in force: who paused what, when and why."""
    return [_out(row) for row in pauses.in_force()]


@router.post("/tasks/{task_id}/pause", auth=OPERATE, response=PAUSED)
def pause_task(request: HttpRequest, task_id: str, body: PauseIn) -> PauseOut:
    """Pause a task on every host: its waiting runs stay pending, running ones finish."""
    return _pause(request, PauseScope.TASK, task_id, body)


@router.post("/tasks/{task_id}/resume", auth=OPERATE, response=RESUMED)
def resume_task(request: HttpRequest, task_id: str) -> PauseOut:
    """End the task's pause and publish its held runs again, most urgent first."""
    return _resume(request, PauseScope.TASK, task_id)


@router.post("/classes/{resource_class}/pause", auth=OPERATE, response=PAUSED)
def pause_class(request: HttpRequest, resource_class: str, body: PauseIn) -> PauseOut:
    """Pause every task of a resource class on every host."""
    return _pause(request, PauseScope.CLASS, resource_class, body)


@router.post("/classes/{resource_class}/resume", auth=OPERATE, response=RESUMED)
def resume_class(request: HttpRequest, resource_class: str) -> PauseOut:
    """End the class's pause and publish its held runs again, most urgent first."""
    return _resume(request, PauseScope.CLASS, resource_class)
