"""Run windows (issue 38): `GET /windows`, and an operator's window of a task or a resource
class: `PUT /tasks/{id}/window`, `PUT /classes/{class}/window`, `DELETE` on the same paths.

An operator's window takes the place of the code's (a task's `window=`) or the environment's
(LUMASTRA_WINDOW_<CLASS>) until it is deleted; it is in force on every host at once. A bad span,
days, zone or `on_close` is a 422 naming the field, and nothing is written. What a window holds:
`orchestrator.windows`; the loop that opens and closes it: `recovery.windows`.
"""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Router, Schema
from pydantic import ConfigDict

from orchestrator import windows
from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.models import PauseScope
from orchestrator.recovery import windows as opening
from orchestrator.recovery.pauses import UnknownScope, tasks_of
from tasks.window import OnClose, Window, WindowError

router = Router(tags=["windows"])


# What the schema can say of a span and of days (`tasks.window.Window` checks them again, with
# what it cannot: a span that opens and closes at once, a zone this machine does not know).
_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]"
_DAY = "(mon|tue|wed|thu|fri|sat|sun)"
_DAYS = f"{_DAY}(-{_DAY})?"


class WindowIn(Schema):
    model_config = ConfigDict(extra="forbid")

    window: str = Field(
        pattern=f"^{_TIME}-{_TIME}$",
        description='"HH:MM-HH:MM", local time; past midnight: "22:00-06:00"',
    )
    days: str = Field(
        "mon-sun",
        max_length=80,
        pattern=f"^{_DAYS}(,{_DAYS})*$",
        description='"mon-fri", "sat,sun", …',
    )
    tz: str | None = Field(None, max_length=64, description="IANA zone; null: LUMASTRA_TIME_ZONE")
    on_close: OnClose = Field(
        OnClose.FINISH,
        description="finish: running runs finish; stop: they are stopped and put back, "
        "to go on in the next window without spending an attempt",
    )

    def parsed(self) -> Window:
        return Window(self.window, days=self.days, tz=self.tz, on_close=self.on_close)


class WindowOut(Schema):
    scope: PauseScope
    name: str = Field(description="the task id, or the resource class")
    window: str
    days: str
    tz: str = Field(description="the zone it is read in")
    on_close: OnClose
    source: str = Field(description="operator, code (the task's definition) or environment")
    actor: str | None = Field(None, description="the operator's window: who set it")
    updated_at: datetime | None = None
    open: bool
    opens_at: datetime | None = Field(description="closed: when it opens next")
    closes_at: datetime = Field(description="when it closes next")


class RemovedOut(Schema):
    removed: bool = Field(description="false: the scope had no operator's window")
    window: WindowOut | None = Field(description="the window in force now (code's or env's)")


def _out(scoped: windows.Scoped, now: datetime) -> WindowOut:
    state = scoped.state(now)
    return WindowOut(
        scope=scoped.scope,
        name=scoped.name,
        window=scoped.window.span,
        days=scoped.window.days,
        tz=scoped.tz,
        on_close=OnClose(scoped.window.on_close),
        source=scoped.source,
        actor=scoped.actor or None,
        updated_at=scoped.updated_at,
        open=state.open,
        opens_at=state.opens_at,
        closes_at=state.closes_at,
    )


def _set(request: HttpRequest, scope: PauseScope, name: str, body: WindowIn) -> WindowOut:
    try:
        tasks_of(scope, name)  # an unknown task or class is a 404 before a bad span is a 422
        scoped = opening.set_window(scope, name, body.parsed(), by=current_user(request).username)
    except UnknownScope as exc:
        raise ApiError(404, str(exc)) from None
    except WindowError as exc:
        error = {"loc": ("body", "body", exc.field), "msg": exc.problem, "type": "value_error"}
        raise ApiError(422, str(exc), [error]) from None
    return _out(scoped, timezone.now())


def _remove(request: HttpRequest, scope: PauseScope, name: str) -> RemovedOut:
    try:
        removed = opening.remove_window(scope, name, by=current_user(request).username)
    except UnknownScope as exc:
        raise ApiError(404, str(exc)) from None
    left = windows.of(scope, name)
    return RemovedOut(removed=removed, window=_out(left, timezone.now()) if left else None)


SET = answers({200: WindowOut}, 404, 422)
REMOVED = answers({200: RemovedOut}, 404)


@router.get("/windows", auth=VIEW, response=answers({200: list[WindowOut]}))
def list_windows(request: HttpRequest) -> list[WindowOut]:
    """Every task and class with a run window: whether it is open, when it opens and closes."""
    now = timezone.now()
    return [_out(scoped, now) for scoped in windows.in_force()]


@router.put("/tasks/{task_id}/window", auth=OPERATE, response=SET)
def set_task_window(request: HttpRequest, task_id: str, body: WindowIn) -> WindowOut:
    """Give a task the operator's run window: its runs start only inside it."""
    return _set(request, PauseScope.TASK, task_id, body)


@router.delete("/tasks/{task_id}/window", auth=OPERATE, response=REMOVED)
def remove_task_window(request: HttpRequest, task_id: str) -> RemovedOut:
    """Drop the task's operator window; the one in its definition, if any, holds again."""
    return _remove(request, PauseScope.TASK, task_id)


@router.put("/classes/{resource_class}/window", auth=OPERATE, response=SET)
def set_class_window(request: HttpRequest, resource_class: str, body: WindowIn) -> WindowOut:
    """Give a resource class the operator's run window: its runs start only inside it."""
    return _set(request, PauseScope.CLASS, resource_class, body)


@router.delete("/classes/{resource_class}/window", auth=OPERATE, response=REMOVED)
def remove_class_window(request: HttpRequest, resource_class: str) -> RemovedOut:
    """Drop the class's operator window; LUMASTRA_WINDOW_<CLASS>, if set, holds again."""
    return _remove(request, PauseScope.CLASS, resource_class)
