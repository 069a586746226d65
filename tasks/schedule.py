"""Static schedule declarations: `every('15m')` or a five-field cron expression.

Only the shape is checked here; syncing into celery beat comes with the scheduler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from celery.schedules import crontab

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
class Every:
    interval: timedelta
    # An environment variable an operator may set to another interval string.
    env_override: str | None = None


@dataclass(frozen=True)
class Cron:
    expression: str

    def fields(self) -> list[str]:
        return self.expression.split()


def every(interval: str, *, env_override: str | None = None) -> Every:
    return Every(parse_interval(interval), env_override)


def cron(expression: str) -> Cron:
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
    return Cron(expression)


Schedule = Every | Cron


def parse_schedule(value: str | Schedule) -> Schedule:
    """A schedule object, or a string: an interval ('15m') or a cron expression."""
    if isinstance(value, Every | Cron):
        return value
    if len(value.split()) == 1:
        return every(value)
    return cron(value)
