"""Slots: the bucket a moment belongs to, and whether a fire was missed.

A slot is named by its start in epoch seconds (UTC):

- an interval of N seconds: `floor(now / N) * N` (slots aligned to the epoch, so every
  replica computes the same slot without talking to the others);
- a cron expression: the latest moment at or before `now` the expression names (so a fire
  that is delivered late still lands in the slot it was fired for).

Cron fields follow celery's `crontab` (day of month AND day of week must both match;
0 = Sunday), in UTC, which is what the synced `CrontabSchedule` rows use.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import crontab

# How far back a cron's previous moment is looked for (a yearly "29 Feb" needs four years).
_CRON_LOOKBACK_DAYS = 366 * 5


@dataclass(frozen=True)
class IntervalSlots:
    interval: timedelta

    def __post_init__(self) -> None:
        if self.interval < timedelta(seconds=1):
            raise ValueError(f"interval {self.interval} is shorter than one second")

    def slot(self, now: datetime) -> int:
        step = int(self.interval.total_seconds())
        epoch = int(now.timestamp())
        return epoch - epoch % step

    def missed(self, last_fired_at: datetime, now: datetime) -> bool:
        """More than one full interval passed since the last fire."""
        return now - last_fired_at > self.interval

    def describe(self) -> str:
        return f"every {self.interval}"


@dataclass(frozen=True)
class CronSlots:
    expression: str

    def _spec(self) -> Any:
        # crontab's expanded field sets are not in celery's type hints.
        minute, hour, day_of_month, month_of_year, day_of_week = self.expression.split()
        return crontab(
            minute=minute,
            hour=hour,
            day_of_month=day_of_month,
            month_of_year=month_of_year,
            day_of_week=day_of_week,
        )

    def previous(self, now: datetime) -> datetime:
        """The latest moment at or before `now` (to the minute) the expression names."""
        spec = self._spec()
        at = now.astimezone(UTC).replace(second=0, microsecond=0)
        day = at.date()
        for back in range(_CRON_LOOKBACK_DAYS):
            weekday = day.isoweekday() % 7  # celery: 0 = Sunday
            if (
                day.month in spec.month_of_year
                and day.day in spec.day_of_month
                and weekday in spec.day_of_week
            ):
                for hour in sorted(spec.hour, reverse=True):
                    if back == 0 and hour > at.hour:
                        continue
                    minutes = [
                        m
                        for m in spec.minute
                        if not (back == 0 and hour == at.hour and m > at.minute)
                    ]
                    if minutes:
                        y, mo, d = day.year, day.month, day.day
                        return datetime(y, mo, d, hour, max(minutes), tzinfo=UTC)
            day -= timedelta(days=1)
        raise ValueError(f"cron {self.expression!r} names no moment in the last five years")

    def slot(self, now: datetime) -> int:
        return int(self.previous(now).timestamp())

    def missed(self, last_fired_at: datetime, now: datetime) -> bool:
        """A moment the expression names passed after the last fire's slot."""
        return self.previous(now) > self.previous(last_fired_at)

    def describe(self) -> str:
        return f"cron {self.expression!r}"


Slots = IntervalSlots | CronSlots
