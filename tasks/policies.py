"""How long a task or a stage may run, and how it is tried again: shared by tasks and stages."""

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
