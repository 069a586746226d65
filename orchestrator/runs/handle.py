"""What a start answers (`RunHandle`) and how it refuses (`StartRefused` and its kinds): shared by
`runs.start`, `runs.batch` and their callers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.stores import counters

log = logging.getLogger(__name__)


class StartRefused(ValueError):
    """`start_run` refused its arguments; nothing was written."""


class KeyContended(StartRefused):
    """Runs with this idempotency key kept starting and ending while this start tried to
    insert its own; trying again later will either join a live run or start one."""


class InvalidInput(StartRefused):
    def __init__(self, task_id: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"input invalid for task {task_id!r}: {errors}")
        self.task_id = task_id
        self.errors = errors


@dataclass(frozen=True)
class RunHandle:
    run_id: str
    task_id: str
    job_id: str
    priority: int
    deduplicated: bool = False  # a live run already does this work: that run is answered
    dropped: bool = False  # backpressure dropped the start: recorded cancelled, never enqueued
    debounced: bool = False  # joined the waiting run of its identity (`runs.coalesce`)
    coalesced: bool = False  # recorded or joined the follow-up of its identity's running run
    next_start_at: datetime | None = None  # throttled: the run met is answered (`hooks.throttle`)

    @property
    def outcome(self) -> str:
        """started, deduplicated, debounced, coalesced, throttled or dropped (the API's
        `outcome`, /metrics' `lumastra_start_outcomes_total`)."""
        if self.dropped:
            return "dropped"
        if self.debounced:
            return "debounced"
        if self.coalesced:
            return "coalesced"
        if self.next_start_at is not None:
            return "throttled"
        return "deduplicated" if self.deduplicated else "started"

    def wait(self, timeout: float) -> Any:
        """Block until the run ends: its result, or `RunFailed` (failed, cancelled) or
        `TimeoutError` (the run goes on). Works from any process (`runs.wait`)."""
        from orchestrator.runs.wait import wait

        return wait(self.run_id, timeout)


def answered(handle: RunHandle) -> RunHandle:
    """A start answered without a new run of its own (or with one born cancelled), counted for
    /metrics by its outcome; a new run's start is counted with its live hash (`live.seed`)."""
    try:
        counters.add(counters.START_OUTCOMES, (handle.task_id, handle.outcome))
    except Exception:
        # The start stands (it may have committed): a count lost is not worth its caller's retry.
        log.exception("run %s: its start's outcome was not counted for /metrics", handle.run_id)
    return handle
