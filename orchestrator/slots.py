"""When a schedule fires, and when a run window opens and closes: the one function the
scheduler, the windows (`orchestrator.windows`), the API and the pages all read.

A slot is a fire's moment in epoch seconds (UTC); the bucket lock and `scheduler_state` name
it, so a slot fires once across the cluster.

- An interval of N seconds is elapsed time: its slots start at `floor(t / N) * N` (aligned to
  the epoch, so every replica computes the same slot without talking to the others), whatever
  a clock change does to the local time.
- A cron expression names local times in its zone (`tz`, an IANA name; the deployment's
  LUMASTRA_TIME_ZONE by default). Its fields follow celery's `crontab` (day of month AND day of
  week must both match; 0 = Sunday). Daylight saving follows Vixie cron and cronie:
  - an expression at fixed times (no `*` in its minute or hour field, e.g. `30 2 * * *`): a
    local time that does not exist (the clock springs forward over it) fires once, at the
    first instant after the gap; a local time that occurs twice (the clock falls back over
    it) fires once, at its first occurrence;
  - an expression with `*` (or `*/n`) in its minute or hour field runs by the wall clock: its
    times inside a gap do not exist and do not fire, its times in a repeated hour fire in
    both passes (each is its own instant, so its own slot).
  No fire is computed twice for one instant, nor in the past of the moment asked about.

`fires(after, count)` gives the next fires strictly after a moment; `slot(now)` the latest
fire at or before it (a fire delivered late still lands in the slot it was fired for).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from functools import cache, lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab

# How far a cron's fires are looked for, either way (a yearly "29 Feb" needs four years).
_CRON_SEARCH_DAYS = 366 * 5


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

    def fires(self, after: datetime, count: int) -> list[datetime]:
        step = int(self.interval.total_seconds())
        first = self.slot(after) + step
        return [datetime.fromtimestamp(first + i * step, UTC) for i in range(count)]

    def missed(self, last_fired_at: datetime, now: datetime) -> bool:
        """More than one full interval passed since the last fire."""
        return now - last_fired_at > self.interval

    def describe(self) -> str:
        return f"every {self.interval}"


@dataclass(frozen=True)
class CronSlots:
    expression: str
    tz: str = "UTC"
    _zone: tzinfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_zone", ZoneInfo(self.tz))

    def _days(self, start: date, step: int) -> Iterator[tuple[datetime, ...]]:
        day = start
        for _ in range(_CRON_SEARCH_DAYS):
            yield _day(self.expression, self.tz, day)
            day += timedelta(days=step)

    def fires(self, after: datetime, count: int) -> list[datetime]:
        """The next `count` fires strictly after `after`."""
        found: list[datetime] = []
        # A fire is at most a day's offset away from its local date: start a day early.
        start = after.astimezone(self._zone).date() - timedelta(days=1)
        for day in self._days(start, 1):
            for at in day:
                # A gap's end can be the next day's own fire too (a zone that skips its
                # midnight): one instant, one fire.
                if at > after and (not found or at > found[-1]):
                    found.append(at)
            if len(found) >= count:
                return found[:count]
        return found

    def previous(self, now: datetime) -> datetime:
        """The latest fire at or before `now`."""
        start = now.astimezone(self._zone).date() + timedelta(days=1)
        for day in self._days(start, -1):
            passed = [at for at in day if at <= now]
            if passed:
                return passed[-1]
        raise ValueError(f"cron {self.expression!r} names no moment in the last five years")

    def slot(self, now: datetime) -> int:
        return int(self.previous(now).timestamp())

    def missed(self, last_fired_at: datetime, now: datetime) -> bool:
        """A fire of the expression passed after the last fire's slot."""
        return self.previous(now) > self.previous(last_fired_at)

    def describe(self) -> str:
        return f"cron {self.expression!r} ({self.tz})"


# The tick asks each schedule for its slot every 10 s: a day's fires are computed once (a
# minute-by-minute cron's day is 1,440 zone conversions).
@lru_cache(maxsize=256)
def _day(expression: str, tz: str, day: date) -> tuple[datetime, ...]:
    """The expression's fires on one local date in `tz`, as UTC instants, in order."""
    spec = _spec(expression)
    if not (
        day.month in spec.month_of_year
        and day.day in spec.day_of_month
        and day.isoweekday() % 7 in spec.day_of_week  # celery: 0 = Sunday
    ):
        return ()
    minute_field, hour_field = expression.split()[:2]
    wall_clock = minute_field.startswith("*") or hour_field.startswith("*")
    zone = ZoneInfo(tz)
    found: set[datetime] = set()
    for hour in spec.hour:
        for minute in spec.minute:
            local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
            found.update(_instants(local, wall_clock))
    return tuple(sorted(found))


@cache
def _spec(expression: str) -> Any:
    # crontab's expanded field sets are not in celery's type hints.
    minute, hour, day_of_month, month_of_year, day_of_week = expression.split()
    return crontab(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
    )


def _instants(local: datetime, wall_clock: bool) -> list[datetime]:
    """The UTC instants a local time (in its zone) fires at (see the module doc)."""
    zone = local.tzinfo
    first = local.replace(fold=0).astimezone(UTC)
    second = local.replace(fold=1).astimezone(UTC)
    if first == second:
        return [first]
    if first.astimezone(zone).replace(tzinfo=None) == local.replace(tzinfo=None):
        # Occurs twice (fold=0 is the earlier instant).
        return [first, second] if wall_clock else [first]
    # Does not exist: fold=1 reads it with the offset after the change, an instant before
    # the gap; fold=0 with the offset before, an instant after it. The gap ends between.
    return [] if wall_clock else [_gap_end(second, first, local.tzinfo)]


def _gap_end(before: datetime, after: datetime, zone: tzinfo | None) -> datetime:
    """The first instant (to the second) whose offset in `zone` is the later one."""
    later = after.astimezone(zone).utcoffset()
    low, high = int(before.timestamp()), int(after.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == later:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


Slots = IntervalSlots | CronSlots


def cadence(cron: str, every_s: int | None, tz: str) -> Slots:
    """An operator's cadence (`scheduler.overrides`): a cron in `tz`, or every `every_s`."""
    return CronSlots(cron, tz) if cron else IntervalSlots(timedelta(seconds=every_s or 0))


def jitter(key: str, slot: int, jitter_s: int) -> int:
    """How many seconds after `slot` begins schedule `key` fires it, with `jitter_s` (0 to
    jitter_s, spread evenly): a digest of the two, so every replica computes the same delay and
    a slot still fires once."""
    if jitter_s <= 0:
        return 0
    digest = hashlib.blake2b(f"{key}@{slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (jitter_s + 1)
