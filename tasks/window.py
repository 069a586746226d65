"""Run windows (quiet hours): the local hours in which a task's or a resource class's work may
start. `Window("01:00-06:00", days="mon-fri", tz="Europe/Berlin", on_close="stop")`.

- `span` "HH:MM-HH:MM", 24-hour local time; a span whose end is not after its start runs past
  midnight (`22:00-06:00`), and `days` names the days it opens on (a Friday's `22:00-06:00`
  closes on Saturday morning).
- `days`: `mon-sun` (every day), a range (`mon-fri`, `fri-mon` wraps), days (`sat,sun`), or both.
- `tz`: an IANA zone; None: the deployment's LUMASTRA_TIME_ZONE.
- `on_close`: `finish` (running runs finish) or `stop` (they are asked to stop and put back,
  to go on in the next window without spending an attempt).

A window is an opening and a closing cron (`opening`, `closing`), so daylight saving moves
it as it moves a cron schedule (`orchestrator.slots`). What a window does to runs:
`orchestrator.windows`. Every check raises `WindowError` naming the field at fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from tasks.schedule import time_zone

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SPAN = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


class OnClose(StrEnum):
    FINISH = "finish"  # running runs finish
    STOP = "stop"  # running runs are asked to stop and put back for the next window


class WindowError(ValueError):
    """A window that cannot be: `field` is the one at fault (window, days, tz or on_close)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Window:
    span: str
    days: str = "mon-sun"
    tz: str | None = None  # None: LUMASTRA_TIME_ZONE
    on_close: OnClose | str = OnClose.FINISH

    def __post_init__(self) -> None:
        self.times()
        object.__setattr__(self, "days", ",".join(DAYS[d] for d in self.day_numbers()))
        if self.tz is not None:
            try:
                time_zone(self.tz)
            except ValueError as exc:
                raise WindowError("tz", str(exc)) from None
        try:
            object.__setattr__(self, "on_close", OnClose(self.on_close))
        except ValueError:
            raise WindowError("on_close", f"{self.on_close!r} is not finish or stop") from None

    def times(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """((hour, minute) it opens, (hour, minute) it closes)."""
        match = _SPAN.match(self.span) if isinstance(self.span, str) else None
        if match is None:
            raise WindowError("window", f"{self.span!r} is not HH:MM-HH:MM (00:00 to 23:59)")
        opens = (int(match[1]), int(match[2]))
        closes = (int(match[3]), int(match[4]))
        if opens == closes:
            raise WindowError("window", f"{self.span!r} opens and closes at the same time")
        return opens, closes

    def day_numbers(self) -> list[int]:
        """The days it opens on, Monday 0 to Sunday 6."""
        found: set[int] = set()
        text = self.days if isinstance(self.days, str) else ""
        for part in text.lower().replace(" ", "").split(","):
            first, dash, last = part.partition("-")
            if first not in DAYS or (dash and last not in DAYS):
                raise WindowError(
                    "days", f"{self.days!r}: expected days such as mon-fri or sat,sun"
                )
            start, end = DAYS.index(first), DAYS.index(last or first)
            found.update((start + step) % 7 for step in range((end - start) % 7 + 1))
        return sorted(found)

    def spans_midnight(self) -> bool:
        opens, closes = self.times()
        return closes <= opens

    def opening(self) -> str:
        """A cron expression firing when the window opens (cron weekdays: Sunday 0)."""
        (hour, minute), _ = self.times()
        return _cron(hour, minute, self.day_numbers())

    def closing(self) -> str:
        """A cron expression firing when the window closes: on the next day for a span past
        midnight."""
        _, (hour, minute) = self.times()
        shift = 1 if self.spans_midnight() else 0
        return _cron(hour, minute, [(day + shift) % 7 for day in self.day_numbers()])

    def describe(self) -> str:
        days = "" if self.days == ",".join(DAYS) else f" {self.days}"
        return f"{self.span}{days}"

    @classmethod
    def parse(cls, text: str) -> Window:
        """A window written on one line, as LUMASTRA_WINDOW_<CLASS> takes it:
        `01:00-06:00 days=mon-fri tz=Europe/Berlin on_close=stop` (all but the span optional)."""
        if not text.split():
            raise WindowError("window", "empty: expected HH:MM-HH:MM")
        span, *options = text.split()
        given: dict[str, str] = {}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep or name not in ("days", "tz", "on_close") or name in given:
                raise WindowError(
                    "window", f"{option!r}: expected days=…, tz=… or on_close=…, each once"
                )
            given[name] = value
        return cls(
            span,
            days=given.get("days", "mon-sun"),
            tz=given.get("tz"),
            on_close=given.get("on_close", OnClose.FINISH),
        )


def _cron(hour: int, minute: int, days: list[int]) -> str:
    weekdays = ",".join(str((day + 1) % 7) for day in sorted(days))
    return f"{minute} {hour} * * {weekdays}"
