"""`/schedules`: every schedule with its next fire and its last outcome (view), and switching
one on or off (operate), as the console's Schedules page does.

- `GET /schedules`: the static schedules (django-celery-beat's rows) and each dynamic
  schedule's rows, read by `scheduler.overview` (its docstring says how a next fire is
  estimated); a dynamic loader that failed is listed with its error.
- `GET /schedules/fires?name=…&after=…&count=…` (`&row=…` for a dynamic row): the next fires
  of one schedule, from the function the scheduler fires by (`scheduler.slots`), as RFC 3339
  moments with the schedule's zone offset. 404 for a schedule that does not exist; 422 for
  an `after` without an offset or a `count` outside 1-50.
- `POST /schedules/static/switch`, `POST /schedules/dynamic/switch`: `scheduler.switch`, the
  one path the console takes too. 404 for a schedule that does not exist, 409 for a static row
  whose task no longer declares a schedule (it stays off). Switching to the state a schedule
  already has changes nothing and says so (`changed: false`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import AwareDatetime, ConfigDict, StrictBool, StringConstraints

from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.fields import Storable
from orchestrator.clock import SYSTEM
from orchestrator.scheduler import overview, switch

router = Router(tags=["schedules"])

MAX_FIRES = 50

# As long as the stores keep them: a beat row's name, a task id, a dynamic row's key.
Name = Annotated[str, StringConstraints(min_length=1, max_length=200), Storable()]


class LastFireOut(Schema):
    at: datetime | None = Field(description="when a slot last fired; null: never")
    run_id: str | None = Field(description="the run it started; null: none")
    error: str | None = Field(description="why the last fired slot started no run")


class StaticOut(Schema):
    name: str
    managed: bool = Field(
        description="synced from a task's definition (cadence, task); the operator owns enabled"
    )
    cadence: str
    enabled: bool
    last_fire: LastFireOut
    beat_last_run_at: datetime | None = Field(description="beat's own record of its last send")
    next_fire_at: datetime | None = Field(description="null while off, or when not estimable")


class DynamicRowOut(Schema):
    row: str
    interval_s: float | None = Field(description="null: the loader no longer returns the row")
    enabled: bool
    last_fire: LastFireOut
    next_fire_at: datetime | None = Field(description="null while off or no longer listed")


class DynamicOut(Schema):
    task: str
    rows: list[DynamicRowOut]
    error: str | None = Field(description="the loader's error; its rows are then unknown")


class SchedulesOut(Schema):
    static: list[StaticOut]
    dynamic: list[DynamicOut]


class StaticSwitchIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="the static schedule's name, as GET /schedules lists it")
    enabled: StrictBool


class DynamicSwitchIn(Schema):
    model_config = ConfigDict(extra="forbid")

    task: Name = Field(description="the task whose dynamic schedule it is")
    row: Name = Field(description="the row's key, as GET /schedules lists it")
    enabled: StrictBool


class FiresIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="a static schedule's name (a task id), or a task with `row`")
    row: Name | None = Field(default=None, description="a dynamic schedule's row key")
    after: AwareDatetime | None = Field(
        default=None, description="RFC 3339 with an offset; default: now"
    )
    count: int = Field(default=5, ge=1, le=MAX_FIRES)


class FiresOut(Schema):
    fires: list[datetime] = Field(description="RFC 3339, in the schedule's zone")
    tz: str = Field(description="the zone: the cron's own, else LUMASTRA_TIME_ZONE")


class SwitchedOut(Schema):
    enabled: bool
    changed: bool = Field(description="false when the schedule already was on (or off)")


def _last(last: overview.LastFire) -> LastFireOut:
    return LastFireOut(at=last.at, run_id=last.run_id or None, error=last.error or None)


@router.get("/schedules", auth=VIEW, response=answers({200: SchedulesOut}))
def list_schedules(request: HttpRequest) -> SchedulesOut:
    """Static schedules by name, then each dynamic schedule's rows by task and row key."""
    return SchedulesOut(
        static=[
            StaticOut(
                name=s.name,
                managed=s.managed,
                cadence=s.cadence,
                enabled=s.enabled,
                last_fire=_last(s.last),
                beat_last_run_at=s.beat_last_run_at,
                next_fire_at=s.next_fire_at,
            )
            for s in overview.static_schedules()
        ],
        dynamic=[
            DynamicOut(
                task=d.task_id,
                rows=[
                    DynamicRowOut(
                        row=r.row_key,
                        interval_s=r.interval.total_seconds() if r.interval else None,
                        enabled=r.enabled,
                        last_fire=_last(r.last),
                        next_fire_at=r.next_fire_at,
                    )
                    for r in d.rows
                ],
                error=d.error or None,
            )
            for d in overview.dynamic_schedules()
        ],
    )


@router.get("/schedules/fires", auth=VIEW, response=answers({200: FiresOut}, 404, 422))
def schedule_fires(request: HttpRequest, query: Query[FiresIn]) -> FiresOut:
    """The next `count` fires strictly after `after`: what the scheduler will fire, daylight
    saving included (a cron's local time that does not exist fires at the end of the gap, one
    that occurs twice fires at its first occurrence)."""
    after = query.after or SYSTEM.now()
    try:
        found, zone = overview.fires(query.name, query.row, after, query.count)
    except overview.UnknownSchedule as exc:
        raise ApiError(404, str(exc)) from None
    return FiresOut(fires=found, tz=zone)


@router.post(
    "/schedules/static/switch", auth=OPERATE, response=answers({200: SwitchedOut}, 404, 409, 422)
)
def switch_static(request: HttpRequest, schedule: StaticSwitchIn) -> SwitchedOut:
    """Switch a static schedule on or off; beat follows at its next check of the rows."""
    actor = current_user(request).username
    try:
        changed = switch.switch_static(schedule.name, enabled=schedule.enabled, actor=actor)
    except switch.UnknownSchedule as exc:
        raise ApiError(404, str(exc)) from None
    except switch.CannotEnable as exc:
        raise ApiError(409, str(exc)) from None
    return SwitchedOut(enabled=schedule.enabled, changed=changed)


@router.post(
    "/schedules/dynamic/switch", auth=OPERATE, response=answers({200: SwitchedOut}, 404, 422)
)
def switch_dynamic(request: HttpRequest, schedule: DynamicSwitchIn) -> SwitchedOut:
    """Switch one row of a dynamic schedule on or off; the scheduler tick skips it while off."""
    actor = current_user(request).username
    try:
        changed = switch.switch_dynamic(
            schedule.task, schedule.row, enabled=schedule.enabled, actor=actor
        )
    except switch.UnknownSchedule as exc:
        raise ApiError(404, str(exc)) from None
    return SwitchedOut(enabled=schedule.enabled, changed=changed)
