"""How long a task or a stage may run, how it is watched, and how it is tried again: shared by
tasks and stages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum


@dataclass(frozen=True)
class Timeout:
    soft: timedelta  # the handler gets a chance to clean up
    hard: timedelta  # the process running it is killed


@dataclass(frozen=True)
class Retry:
    """How a run that raised TransientError is tried again: exponential backoff from `base`,
    doubling per attempt, capped at `cap`, jittered over its upper half. `max_attempts`
    counts the first attempt."""

    max_attempts: int = 3
    base: timedelta = timedelta(seconds=2)
    cap: timedelta = timedelta(minutes=5)


@dataclass(frozen=True)
class Stall:
    """How long a handler may go without a sign of progress (`report_progress` or `log`)
    before a warning and before its run fails as `stalled`; a `fail` of None: the resource
    class's (`tasks.resources.default_stall_fail_s`, LUMASTRA_STALL_FAIL_S_<CLASS>); a `warn`
    of None: a fifth of the fail window. `auto=True` counts a handler that is still running
    as alive (long ffmpeg- or chromaprint-like calls that cannot report): only its hard
    timeout stops it. A command run with `ctx.run_process` reports by its output."""

    warn: timedelta | None = None
    fail: timedelta | None = None
    auto: bool = False


@dataclass(frozen=True)
class Debounce:
    """Starts of one identity that come in a burst make one run, with the last start's input:
    a start finds the run an earlier start recorded, still waiting, replaces its input and moves
    its start to `period_s` from now, never later than `max_wait_s` after the first start
    (`orchestrator.runs.coalesce`)."""

    period_s: int
    max_wait_s: int


@dataclass(frozen=True)
class Throttle:
    """At most one run per identity per `period_s`: a later start is answered `throttled` with
    the run it met and when the next may start (`orchestrator.hooks.throttle`)."""

    period_s: int


class WhileActive(StrEnum):
    """What a start does when it meets a live run of its identity (`identity_for`).

    JOIN: it is answered with that run (`deduplicated`). FOLLOW_UP: when that run is already
    running, one follow-up is recorded and starts as a new run once it ends, whatever its end;
    later starts give the follow-up their input (`coalesced`, `orchestrator.runs.coalesce`)."""

    JOIN = "join"
    FOLLOW_UP = "follow_up"
