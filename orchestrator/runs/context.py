"""The engine's implementation of the SDK's `TaskContext`."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from redis.exceptions import RedisError

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks import costs
from orchestrator.runs import process
from orchestrator.runs.logs import RunLog
from orchestrator.runs.progress import Progress
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from tasks.errors import ErrorKind, RunCancelled
from tasks.process import ProcessResult

log = logging.getLogger(__name__)

# Bounds on what a handler may record on its step, so a loop cannot bloat the run's row.
MAX_WARNINGS = 50
MAX_NAME_LENGTH = 64
MAX_NAMES = 50


class RunContext:
    def __init__(
        self,
        run_id: str,
        input: Any,
        clock: Clock = SYSTEM,
        *,
        task_id: str = "",
        results: Mapping[str, Any] | None = None,
        stage: str | None = None,
    ) -> None:
        self._run_id = run_id
        self._task_id = task_id
        self._input = input
        # What this attempt recorded on its step (`orchestrator/runs/steps.py` keeps them).
        self.warnings: list[str] = []
        self.counters: dict[str, int] = {}
        self.cost: dict[str, float] = {}
        self._results: Mapping[str, Any] = MappingProxyType(dict(results or {}))
        self._clock = clock
        # One gate for everything this attempt's handler thread sends to Valkey itself.
        self._sends = valkey.HandlerSends()
        self.run_log = RunLog(run_id, stage, clock, self._sends)
        # Made by the handler's first report: a run that reports none carries nothing for it.
        self.progress: Progress | None = None
        # Set by the run's watch thread when a cancel is published or seen in the hash.
        self._cancel = threading.Event()
        # monotonic time of the last sign of progress, read by the stall watchdog.
        self.progressed_at = time.monotonic()
        self._state_read_at = 0.0

    def trip_cancel(self) -> None:
        self._cancel.set()

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def input(self) -> Any:
        return self._input

    @property
    def results(self) -> Mapping[str, Any]:
        return self._results

    def log(self, message: str) -> None:
        self.progressed_at = time.monotonic()
        self.run_log.write("info", message)

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(str(message)[:1000])
        self.progressed_at = time.monotonic()
        self.run_log.write("warning", message)

    def count(self, name: str, n: int = 1) -> None:
        _check_name("counter", name, self.counters)
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"count({name!r}, n): n must be an int, not {type(n).__name__}")
        self.counters[name] = self.counters.get(name, 0) + n

    def spend(self, kind: str, units: float) -> None:
        _check_name("cost kind", kind, self.cost)
        if isinstance(units, bool) or not isinstance(units, int | float):
            raise TypeError(f"spend({kind!r}, units): units must be a number")
        if not math.isfinite(units) or units < 0:
            raise ValueError(f"spend({kind!r}, units): units must be finite and >= 0, not {units}")
        self.cost[kind] = self.cost.get(kind, 0) + units
        if self._task_id:
            try:
                costs.record(self._task_id, kind, units, self._clock)
            except RedisError:
                # The run's row still gets it at its end (its cost_breakdown); only the day's
                # running count in Valkey, which cost quotas read, misses it.
                log.warning(
                    "run %s: %s spend not counted in Valkey (unreachable)", self._run_id, kind
                )

    def report_progress(
        self, done: float, total: float | None = None, item: str | None = None
    ) -> None:
        if self.progress is None:
            self.progress = Progress(self._run_id, self._clock, self._sends)
        self.progress.report(done, total, item)
        self.progressed_at = time.monotonic()

    def flush_progress(self, *, final: bool = False) -> None:
        """The latest report to the live hash, if one waits (`runs.progress`)."""
        if self.progress is not None:
            self.progress.flush(final=final)

    def write_progress_row(self) -> None:
        """The latest report to the run's row, when it is due (`runs.progress`)."""
        if self.progress is not None:
            self.progress.write_row()

    def extras(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """What a plain run's end writes beside its result or error: its step's warnings,
        counters, cost and log tail, and its latest progress; each None when it has none."""
        progress = None if self.progress is None else self.progress.document()
        tail = list(self.run_log.tail)
        if not (self.warnings or self.counters or self.cost or tail):
            return None, progress
        step: dict[str, Any] = {
            "warnings": self.warnings,
            "counters": self.counters,
            "cost": self.cost,
        }
        if tail:
            step["log_tail"] = tail
        return step, progress

    @property
    def cancelled(self) -> bool:
        # The watch thread trips the flag from its process's cancel channel; a message published
        # before the watch took this run is caught by reading the hash, at most once a second.
        if (
            not self._cancel.is_set()
            and time.monotonic() - self._state_read_at > 1.0
            and self._sends.open
        ):
            self._state_read_at = time.monotonic()
            try:
                state = self._sends.send(
                    lambda: valkey.client().hget(keys.run_active(self._run_id), "state")
                )
            except RedisError:
                # Valkey away (a partition, a restart) must not fail the handler: its watch
                # hears a cancel once Valkey answers.
                return False
            if state == RunState.CANCELLING:
                self._cancel.set()
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise RunCancelled(f"run {self._run_id} was cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake and raise RunCancelled as soon as the run is cancelled."""
        if self.cancelled or self._cancel.wait(seconds):
            raise RunCancelled(f"run {self._run_id} was cancelled")

    def run_process(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        on_stdout: Callable[[str], None] | None = None,
        fails_as: ErrorKind | Callable[[ProcessResult], ErrorKind] = ErrorKind.TRANSIENT,
        grace_s: float = 5.0,
    ) -> ProcessResult:
        return process.run(
            self,
            argv,
            cwd=cwd,
            env=env,
            on_stdout=on_stdout,
            fails_as=fails_as,
            grace_s=grace_s,
        )


def _check_name(what: str, name: str, known: Mapping[str, object]) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH:
        raise ValueError(f"a {what} must be a name of 1 to {MAX_NAME_LENGTH} characters")
    if name not in known and len(known) >= MAX_NAMES:
        raise ValueError(f"at most {MAX_NAMES} {what}s per step; {name!r} is one too many")
