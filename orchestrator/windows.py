"""Run windows (issue 38): the local hours a task's or a resource class's runs may start in.

Where a scope's window comes from (a scope: `task` and a task id, or `class` and a class):
- an operator's (`run_window`, `PUT /api/v1/{tasks,classes}/…/window`), which takes the place of
- the code's for a task (`define_task(window=Window(…))`), LUMASTRA_WINDOW_<CLASS> for a class.
A run needs both its task's window and its class's open to start.

A window is an opening and a closing cron in its zone (`tasks.window`), computed by the one
function schedules fire by (`orchestrator.slots`): it is open when its latest opening is later
than its latest closing. Daylight saving moves its edges as it moves a cron's fires (an edge
inside the spring gap comes at the gap's end; one in the repeated hour at its first pass).

A closed window holds runs as a pause does (`hooks.pause`, `recovery.pauses`): its scope's
field of the pauses' Valkey mirror (`task:<id>`, `class:<name>`) says `window` (`live.WINDOW`,
with the one rule of what holds a run: `live.holds`), which the start's
admission script lets through (starts are taken, recorded `pending`) and the claim's script
refuses, unless the run is an operator's (priority 1: "run now", an operator's retry). A pause
of the same scope says its own mode there; it holds whatever the window says. The leader's
`windows` loop keeps the mirror true every TICK_S (`recovery.windows`): it closes and opens
the windows' fields and, when a window opens, publishes the runs it held, most urgent first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from orchestrator.models import PauseScope, RunWindow
from orchestrator.slots import CronSlots
from orchestrator.stores import keys
from tasks import registry
from tasks.window import OnClose, Window, WindowError

# How often the leader makes the mirror say which windows are closed (`recovery.windows`).
TICK_S = 1.0


class Source:
    CODE = "code"  # the task's definition
    ENVIRONMENT = "environment"  # LUMASTRA_WINDOW_<CLASS>
    OPERATOR = "operator"  # a run_window row


@dataclass(frozen=True)
class Scoped:
    """The window in force for one scope, and where it comes from."""

    scope: PauseScope
    name: str
    window: Window
    source: str
    actor: str = ""
    updated_at: datetime | None = None

    @property
    def field(self) -> str:
        return keys.pause_field(self.scope, self.name)

    @property
    def tz(self) -> str:
        return self.window.tz or settings.CONFIG.time_zone

    def state(self, now: datetime) -> State:
        return state_of(self.window, self.tz, now)


@dataclass(frozen=True)
class State:
    open: bool
    opened_at: datetime | None  # open: when it opened
    opens_at: datetime | None  # closed: when it opens next
    closes_at: datetime  # when it closes next (closed: after `opens_at`)


def state_of(window: Window, tz: str, now: datetime) -> State:
    opening = CronSlots(window.opening(), tz)
    closing = CronSlots(window.closing(), tz)
    opened = opening.previous(now)
    if opened > closing.previous(now):
        return State(True, opened, None, closing.fires(now, 1)[0])
    opens_at = opening.fires(now, 1)[0]
    return State(False, None, opens_at, closing.fires(opens_at, 1)[0])


def from_row(row: RunWindow) -> Window:
    return Window(row.span, days=row.days, tz=row.tz or None, on_close=row.on_close)


def in_force() -> list[Scoped]:
    """Every scope that has a window, the operator's first; ordered by scope and name."""
    found: dict[tuple[str, str], Scoped] = {}
    for definition in registry.get().values():
        if definition.window is not None:
            scoped = Scoped(PauseScope.TASK, definition.id, definition.window, Source.CODE)
            found[(scoped.scope, scoped.name)] = scoped
    for name, window in settings.CONFIG.class_windows.items():
        found[(PauseScope.CLASS, name)] = Scoped(PauseScope.CLASS, name, window, Source.ENVIRONMENT)
    for row in RunWindow.objects.all():
        scope = PauseScope(row.scope)
        found[(scope, row.name)] = Scoped(
            scope, row.name, from_row(row), Source.OPERATOR, row.actor, row.updated_at
        )
    return [found[key] for key in sorted(found)]


def of(scope: str, name: str) -> Scoped | None:
    """The window in force for one scope, if any."""
    return next((s for s in in_force() if (s.scope, s.name) == (scope, name)), None)


# A week and a day: every weekly pattern of two windows shows within it.
_OVERLAP_HORIZON = timedelta(days=8)


def together(a: Scoped, b: Scoped, now: datetime) -> bool:
    """Whether both windows are open at one moment between `now` and the horizon: two spans
    meet when one opens while the other is open."""
    if a.state(now).open and b.state(now).open:
        return True
    for one, other in ((a, b), (b, a)):
        openings = CronSlots(one.window.opening(), one.tz).fires(now, _OVERLAP_HORIZON.days + 1)
        if any(other.state(at).open for at in openings if at <= now + _OVERLAP_HORIZON):
            return True
    return False


def check_overlap(new: Scoped, now: datetime) -> None:
    """WindowError when `new` is never open together with a window its runs also need (its
    class's, for a task; each of its tasks', for a class): they would wait forever."""
    found = {(s.scope, s.name): s for s in in_force()}
    definitions = registry.get()
    if new.scope == PauseScope.TASK:
        others = [found.get((PauseScope.CLASS, definitions[new.name].resource_class))]
    else:
        others = [
            found.get((PauseScope.TASK, d.id))
            for d in definitions.values()
            if d.resource_class == new.name
        ]
    for other in others:
        if other is not None and not together(new, other, now):
            raise WindowError(
                "window",
                f"never open at the same time as the window of {other.scope} {other.name} "
                f"({other.window.describe()}): its runs would wait forever",
            )


@dataclass(frozen=True)
class Now:
    """The windows at one moment: each scope's window and state, by mirror field."""

    windows: Mapping[str, tuple[Scoped, State]]

    @classmethod
    def at(cls, now: datetime) -> Now:
        return cls({s.field: (s, s.state(now)) for s in in_force()})

    def closed(self) -> dict[str, Scoped]:
        return {f: scoped for f, (scoped, state) in self.windows.items() if not state.open}

    def stopping(self) -> dict[str, Scoped]:
        """The closed windows that stop their running runs."""
        return {f: s for f, s in self.closed().items() if s.window.on_close == OnClose.STOP}

    def opened_s(self, now: datetime) -> dict[str, float]:
        """Seconds since each open window opened."""
        return {
            f: (now - state.opened_at).total_seconds()
            for f, (_, state) in self.windows.items()
            if state.opened_at is not None
        }

    def holding(self, fields: Iterable[str]) -> tuple[Scoped, State] | None:
        """The closed window among `fields` (a run's task's and class's) that opens last."""
        closed = [self.windows[f] for f in fields if f in self.windows]
        closed = [pair for pair in closed if not pair[1].open]
        return max(closed, key=lambda pair: pair[1].opens_at or pair[1].closes_at, default=None)
