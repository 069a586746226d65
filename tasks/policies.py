"""How long a task or a stage may run, how it is watched, and how it is tried again: shared by
tasks and stages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


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
