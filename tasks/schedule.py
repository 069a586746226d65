"""Schedule declarations: `every('15m')`, a five-field cron expression in a time zone
(`cron("30 2 * * *", tz="Europe/Berlin")`), or `dynamic(loader)`.

Only the shape is checked here (a zone must be an IANA name this machine knows).
`orchestrator.scheduler` syncs static schedules into celery beat (resolving `env_override`
there) and fires dynamic rows from its 10 s tick.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab

# The longest delay `jitter_s` may add to a fire: an hour.
MAX_JITTER_S = 3600
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_INTERVAL = re.compile(r"^(\d+)([smhd])$")


def parse_interval(text: str) -> timedelta:
    """'90s', '15m', '6h', '1d' → timedelta; anything else is a ValueError."""
    match = _INTERVAL.match(text.strip())
    if not match:
        raise ValueError(f"bad interval {text!r}: expected a number and s, m, h or d, e.g. '15m'")
    interval = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if interval <= timedelta(0):
        raise ValueError(f"bad interval {text!r}: must be positive")
    return interval


@dataclass(frozen=True)
class Policies:
    """What a static schedule does beyond firing (Temporal's schedule policies):
    - `pause_on_failure`: after that many of its runs failed in a row, the schedule switches
      itself off, the reason on the Schedules page (`scheduler.policies`);
    - `catch_up_within_s`: the boot catch-up fires a missed slot only if it began at most that
      long ago (None: whenever it began; `scheduler.catchup`);
    - `jitter_s`: each slot fires up to that many seconds after it begins, the same delay on
      every replica (`orchestrator.slots.jitter`), so many schedules of one cadence do not all
      start at once (0: none; at most MAX_JITTER_S)."""

    pause_on_failure: int | None = None
    catch_up_within_s: int | None = None
    jitter_s: int = 0

    def __post_init__(self) -> None:
        for name in ("pause_on_failure", "catch_up_within_s", "jitter_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            if value is not None and value < (0 if name == "jitter_s" else 1):
                raise ValueError(f"{name} must be at least {int(name != 'jitter_s')}, got {value}")
        if self.jitter_s > MAX_JITTER_S:
            raise ValueError(f"jitter_s must be at most {MAX_JITTER_S}, got {self.jitter_s}")


@dataclass(frozen=True)
class Every:
    interval: timedelta
    # An environment variable an operator may set to another interval string.
    env_override: str | None = None
    policies: Policies = Policies()


@dataclass(frozen=True)
class Cron:
    expression: str
    tz: str | None = None  # an IANA zone; None: the deployment's LUMASTRA_TIME_ZONE
    policies: Policies = Policies()

    def fields(self) -> list[str]:
        return self.expression.split()


def every(
    interval: str,
    *,
    env_override: str | None = None,
    pause_on_failure: int | None = None,
    catch_up_within_s: int | None = None,
    jitter_s: int = 0,
) -> Every:
    policies = Policies(pause_on_failure, catch_up_within_s, jitter_s)
    return Every(parse_interval(interval), env_override, policies)


def time_zone(name: str) -> ZoneInfo:
    """The IANA zone `name` ("Europe/Berlin", "UTC"); a ValueError names one it does not know."""
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, ZoneInfoNotFoundError):
        # OSError: a folder ("Europe") or a name longer than a file name may be.
        raise ValueError(
            f"unknown time zone {name!r}: expected an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


def cron(
    expression: str,
    *,
    tz: str | None = None,
    pause_on_failure: int | None = None,
    catch_up_within_s: int | None = None,
    jitter_s: int = 0,
) -> Cron:
    """Fires at the local times `expression` names in `tz` (default: LUMASTRA_TIME_ZONE);
    how daylight saving moves them: `orchestrator.slots`."""
    if tz is not None:
        time_zone(tz)
    parts = expression.split()
    if len(parts) != 5:
        raise ValueError(f"bad cron {expression!r}: expected 5 fields, got {len(parts)}")
    minute, hour, day_of_month, month_of_year, day_of_week = parts
    # crontab expands each field eagerly and raises ValueError on a bad one.
    crontab(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
    )
    return Cron(expression, tz, Policies(pause_on_failure, catch_up_within_s, jitter_s))


@dataclass(frozen=True)
class ScheduleRow:
    """One row of a dynamic schedule: fired once per `interval` slot with `input`.

    `key` names the row (e.g. an EPG source's slug): it is part of the bucket lock and of the
    row's `scheduler_state` key, so it must be stable across loads."""

    key: str
    input: Mapping[str, Any] = field(default_factory=dict)
    interval: timedelta | str = timedelta(minutes=15)


# A loader returns rows; a 3-tuple (key, input, interval) is accepted as a row too.
RowLike = ScheduleRow | tuple[str, Mapping[str, Any], timedelta | str]
Loader = Callable[[], Iterable[RowLike]]


@dataclass(frozen=True)
class Dynamic:
    """Rows loaded at every scheduler tick, each with its own cadence."""

    loader: Loader


def dynamic(loader: Loader) -> Dynamic:
    """`schedule=dynamic(loader)`: `loader()` returns the rows to fire, each on its cadence.

    The loader runs in the worker role's loops process every scheduler tick (10 s): keep it
    to one cheap query. A row whose key, input or interval is bad is logged and skipped."""
    if not callable(loader):
        raise TypeError("dynamic(loader): loader must be callable and return rows")
    return Dynamic(loader)


def to_row(value: RowLike) -> ScheduleRow:
    """A loader's row as a ScheduleRow with a parsed interval; ValueError names the problem."""
    if isinstance(value, ScheduleRow):
        row = value
    elif isinstance(value, tuple) and len(value) == 3:
        row = ScheduleRow(*value)
    else:
        raise ValueError(f"a row must be ScheduleRow or (key, input, interval), got {value!r}")
    if not isinstance(row.key, str) or not row.key.strip():
        raise ValueError(f"row key must be a non-empty string, got {row.key!r}")
    if not isinstance(row.input, Mapping):
        raise ValueError(f"row {row.key!r}: input must be a mapping")
    interval = row.interval
    if isinstance(interval, str):
        try:
            interval = parse_interval(interval)
        except ValueError as exc:
            raise ValueError(f"row {row.key!r}: {exc}") from None
    if not isinstance(interval, timedelta) or interval < timedelta(seconds=1):
        raise ValueError(f"row {row.key!r}: interval must be at least one second")
    return ScheduleRow(row.key, row.input, interval)


Schedule = Every | Cron | Dynamic


def parse_schedule(value: str | Schedule) -> Schedule:
    """A schedule object, or a string: an interval ('15m') or a cron expression."""
    if isinstance(value, Every | Cron | Dynamic):
        return value
    if len(value.split()) == 1:
        return every(value)
    return cron(value)
