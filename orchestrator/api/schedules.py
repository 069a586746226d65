"""`/schedules`: every schedule with its next fire and its last outcome (view), and switching
one on or off (operate), as the console's Schedules page does.

- `GET /schedules`: the static schedules (django-celery-beat's rows) and each dynamic
  schedule's rows, read by `scheduler.overview` (its docstring says how a next fire is
  estimated); a dynamic loader that failed is listed with its error.
- `GET /schedules/fires?name=…&after=…&count=…` (`&row=…` for a dynamic row): the next fires
  of one schedule, from the function the scheduler fires by (`orchestrator.slots`), as RFC 3339
  moments with the schedule's zone offset. 404 for a schedule that does not exist; 409 for
  an operator's own beat row (beat alone fires it); 422 for an `after` without an offset or
  outside the years 1970-9000, or a `count` outside 1-50.
- `POST /schedules/static/override`, `POST /schedules/static/reset` (and the same pair under
  `/schedules/dynamic/` with `task` and `row`): an operator's cadence for a schedule,
  `scheduler.overrides` (`cron` with an optional `tz`, or `every_s`; `jitter_s`), kept across
  syncs and deploys until reset. 422 naming the field for a bad cron, zone, interval or jitter
  (nothing written); 404 for a schedule that does not exist; 409 for a beat row not synced
  from a task (edited under Periodic tasks).
- `POST /schedules/backfill {"name", "from", "to"}`: `scheduler.backfill`, each slot no run
  carries fired once, under the schedule's overlap policy. 404, 409 as above; 422 for `from`
  after `to`, outside the years 1970-9000, or more than 1,000 slots.
- `POST /schedules/static/switch`, `POST /schedules/dynamic/switch`: `scheduler.switch`, the
  one path the console takes too. 404 for a schedule that does not exist, 409 for a static row
  whose task no longer declares a schedule (it stays off). Switching to the state a schedule
  already has changes nothing and says so (`changed: false`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import (
    AwareDatetime,
    BeforeValidator,
    ConfigDict,
    StrictBool,
    StringConstraints,
)

from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.fields import Storable, whole
from orchestrator.clock import SYSTEM
from orchestrator.models import ScheduleOverride
from orchestrator.scheduler import backfill, overrides, overview, switch
from orchestrator.scheduler.sync import overridden
from tasks.schedule import MAX_JITTER_S

router = Router(tags=["schedules"])

MAX_FIRES = 50

# As long as the stores keep them: a beat row's name, a task id, a dynamic row's key.
Name = Annotated[str, StringConstraints(min_length=1, max_length=200), Storable()]


class LastFireOut(Schema):
    at: datetime | None = Field(description="when a slot last fired; null: never")
    run_id: str | None = Field(description="the run it started; null: none")
    error: str | None = Field(description="why the last fired slot started no run")


class OverriddenOut(Schema):
    cadence: str = Field(description="the operator's cadence the schedule runs on")
    actor: str
    at: datetime


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
    next_fires: list[datetime] = Field(description="the next few, in `tz`; empty while off")
    tz: str
    override: OverriddenOut | None = Field(description="null: the definition's cadence")


class DynamicRowOut(Schema):
    row: str
    interval_s: float | None = Field(description="null: the loader no longer returns the row")
    enabled: bool
    last_fire: LastFireOut
    next_fire_at: datetime | None = Field(description="null while off or no longer listed")
    override: OverriddenOut | None = Field(description="null: the loader's interval")


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
        default=None, description="RFC 3339 with an offset, years 1970-9000; default: now"
    )
    count: int = Field(default=5, ge=1, le=MAX_FIRES)


class BackfillIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="the static schedule's name (its task id)")
    start: AwareDatetime = Field(alias="from", description="RFC 3339 with an offset; included")
    end: AwareDatetime = Field(alias="to", description="RFC 3339; included; later than now: now")


class BackfilledSlot(Schema):
    slot: datetime
    run_id: str | None = Field(None, description="started: the run; skipped: the live run")
    reason: str | None = Field(None, description="refused: why")


class BackfillOut(Schema):
    started: list[BackfilledSlot]
    present: list[datetime] = Field(description="slots a run already carries")
    skipped: list[BackfilledSlot] = Field(description="overlap=skip: the previous run is live")
    refused: list[BackfilledSlot] = Field(description="admission refused the start")


class FiresOut(Schema):
    fires: list[datetime] = Field(description="RFC 3339, in the schedule's zone")
    tz: str = Field(description="the zone: the cron's own, else LUMASTRA_TIME_ZONE")


# Five fields apart by spaces (and no NUL, which Postgres cannot store); what each may hold is
# checked by the cron parser (422 naming `cron`).
Expression = Annotated[
    str, StringConstraints(max_length=200, pattern=r"^ *[^ \x00]+( +[^ \x00]+){4} *$")
]
Seconds = Annotated[int, Field(ge=1, le=overrides.MAX_EVERY_S), BeforeValidator(whole)]
Zone = Annotated[str, StringConstraints(min_length=1, max_length=64), Storable()]
Jitter = Annotated[int, Field(ge=0, le=MAX_JITTER_S), BeforeValidator(whole)]


class CadenceIn(Schema):
    model_config = ConfigDict(extra="forbid")

    cron: Expression | None = Field(default=None, description="five fields, e.g. '30 2 * * *'")
    every_s: Seconds | None = Field(default=None, description="an interval in seconds")
    tz: Zone | None = Field(
        default=None, description="a cron's IANA zone; default LUMASTRA_TIME_ZONE"
    )
    jitter_s: Jitter | None = Field(
        default=None,
        description="each fire waits up to this many seconds into its slot, the same on every "
        "replica (shorter than an interval); null: the definition's",
    )

    def cadence(self) -> overrides.Cadence:
        return overrides.Cadence(self.cron or "", self.every_s, self.tz or "", self.jitter_s)


class StaticOverrideIn(CadenceIn):
    name: Name = Field(description="the static schedule's name (its task id)")


class DynamicOverrideIn(CadenceIn):
    task: Name
    row: Name


class StaticResetIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: Name


class DynamicResetIn(Schema):
    model_config = ConfigDict(extra="forbid")

    task: Name
    row: Name


class OverrideOut(Schema):
    key: str = Field(description="the schedule: its name, or <task>:<row>")
    cadence: str
    cron: str | None
    every_s: int | None
    tz: str | None = Field(description="the zone given; null: LUMASTRA_TIME_ZONE")
    jitter_s: int | None = Field(description="null: the definition's")
    actor: str
    updated_at: datetime


class ResetOut(Schema):
    reset: bool = Field(description="false when the schedule had no override")


class SwitchedOut(Schema):
    enabled: bool
    changed: bool = Field(description="false when the schedule already was on (or off)")


def _overridden(override: overview.Override | None) -> OverriddenOut | None:
    if override is None:
        return None
    return OverriddenOut(cadence=override.cadence, actor=override.actor, at=override.at)


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
                next_fires=list(s.next_fires),
                tz=s.tz,
                override=_overridden(s.override),
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
                        override=_overridden(r.override),
                    )
                    for r in d.rows
                ],
                error=d.error or None,
            )
            for d in overview.dynamic_schedules()
        ],
    )


@router.get("/schedules/fires", auth=VIEW, response=answers({200: FiresOut}, 404, 409, 422))
def schedule_fires(request: HttpRequest, query: Query[FiresIn]) -> FiresOut:
    """The next `count` fires strictly after `after`: what the scheduler will fire, daylight
    saving included (a cron's local time that does not exist fires at the end of the gap, one
    that occurs twice fires at its first occurrence)."""
    try:
        slots = overview.schedule(query.name, query.row)
    except overview.UnknownSchedule as exc:
        raise ApiError(404, str(exc)) from None
    except overview.NotOurs as exc:
        raise ApiError(409, str(exc)) from None
    after = query.after or SYSTEM.now()
    if not 1970 <= after.year <= 9000:
        # Before the epoch or past 9000 is no schedule's business (past 9994 not representable).
        error = {"loc": ("query", "after"), "msg": "must be between the years 1970 and 9000"}
        raise ApiError(422, "after: must be between the years 1970 and 9000", [error])
    return FiresOut(fires=overview.fires(slots, after, query.count), tz=overview.zone_of(slots))


def _override_out(override: ScheduleOverride) -> OverrideOut:
    return OverrideOut(
        key=override.key,
        cadence=overridden(override).describe(),
        cron=override.cron or None,
        every_s=override.every_s,
        tz=override.tz or None,
        jitter_s=override.jitter_s,
        actor=override.actor,
        updated_at=override.updated_at,
    )


@contextmanager
def _override_refusals() -> Iterator[None]:
    try:
        yield
    except overrides.BadOverride as exc:
        error = {"loc": ("body", "schedule", exc.field), "msg": str(exc), "type": "value_error"}
        raise ApiError(422, str(exc), [error]) from None
    except switch.UnknownSchedule as exc:
        raise ApiError(404, str(exc)) from None
    except overrides.CannotOverride as exc:
        raise ApiError(409, str(exc)) from None


@router.post(
    "/schedules/static/override",
    auth=OPERATE,
    response=answers({200: OverrideOut}, 404, 409, 422),
)
def override_static(request: HttpRequest, schedule: StaticOverrideIn) -> OverrideOut:
    """Give a static schedule the operator's cadence, on every replica at its next tick."""
    with _override_refusals():
        found = overrides.set_static(
            schedule.name, schedule.cadence(), actor=current_user(request).username
        )
    return _override_out(found)


@router.post(
    "/schedules/static/reset", auth=OPERATE, response=answers({200: ResetOut}, 404, 409, 422)
)
def reset_static(request: HttpRequest, schedule: StaticResetIn) -> ResetOut:
    """Drop a static schedule's override: the definition's cadence is back."""
    with _override_refusals():
        reset = overrides.reset_static(schedule.name, actor=current_user(request).username)
    return ResetOut(reset=reset)


@router.post(
    "/schedules/dynamic/override", auth=OPERATE, response=answers({200: OverrideOut}, 404, 422)
)
def override_dynamic(request: HttpRequest, schedule: DynamicOverrideIn) -> OverrideOut:
    """Give one row of a dynamic schedule the operator's cadence, in place of its loader's."""
    with _override_refusals():
        found = overrides.set_dynamic(
            schedule.task, schedule.row, schedule.cadence(), actor=current_user(request).username
        )
    return _override_out(found)


@router.post("/schedules/dynamic/reset", auth=OPERATE, response=answers({200: ResetOut}, 404, 422))
def reset_dynamic(request: HttpRequest, schedule: DynamicResetIn) -> ResetOut:
    """Drop a dynamic row's override: its loader's interval is back."""
    with _override_refusals():
        reset = overrides.reset_dynamic(
            schedule.task, schedule.row, actor=current_user(request).username
        )
    return ResetOut(reset=reset)


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


@router.post(
    "/schedules/backfill", auth=OPERATE, response=answers({200: BackfillOut}, 404, 409, 422)
)
def backfill_schedule(request: HttpRequest, body: BackfillIn) -> BackfillOut:
    """Fire each slot of a static schedule between `from` and `to` that no run carries, once,
    oldest first, under the schedule's overlap policy (`skip`: none while its previous run is
    live)."""
    now = SYSTEM.now()
    try:
        done = backfill.backfill(
            body.name, body.start, body.end, now, by=current_user(request).username
        )
    except overview.UnknownSchedule as exc:
        raise ApiError(404, str(exc)) from None
    except (overview.NotOurs, backfill.NotScheduled) as exc:
        raise ApiError(409, str(exc)) from None
    except backfill.BadRange as exc:
        field = "from" if exc.field == "start" else "to"
        error = {"loc": ("body", "body", field), "msg": str(exc), "type": "value_error"}
        raise ApiError(422, f"{field}: {exc}", [error]) from None
    return BackfillOut(
        started=[BackfilledSlot(slot=s, run_id=r, reason=None) for s, r in done.started],
        present=done.present,
        skipped=[BackfilledSlot(slot=s, run_id=r, reason=None) for s, r in done.skipped],
        refused=[BackfilledSlot(slot=s, run_id=None, reason=why) for s, why in done.refused],
    )
