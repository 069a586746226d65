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
    before a warning and before its run fails as `stalled`; None: the worker's defaults
    (LUMASTRA_RUN_STALL_WARN_MS, LUMASTRA_RUN_STALL_FAIL_MS). `auto=True` counts a handler
    that is still running as alive (long ffmpeg- or chromaprint-like calls that cannot
    report): only its hard timeout stops it."""

    warn: timedelta | None = None
    fail: timedelta | None = None
    auto: bool = False
