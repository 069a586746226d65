"""Wall time per step of start_run and of the runner, measured in the benchmark process.

cProfile says which functions cost most but inflates Python code relative to waiting on a
socket; this answers the other question, "how many milliseconds of each run are Postgres,
Valkey, the broker and plain Python", with two `perf_counter` calls per step. Steps are timed
by wrapping functions in this process only, for the duration of a `with StepTimer()` block.

Rows are either round trips ("io": one SQL statement, one Redis command or pipeline, a commit,
the connection health check) or groups of them (an orchestrator call such as the Lua claim);
"python" is the run's total minus its round trips.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import connections


@dataclass
class Step:
    label: str
    io: bool
    seconds: float = 0.0
    calls: int = 0


@dataclass
class StepTimer:
    steps: dict[str, Step] = field(default_factory=dict)
    _undo: list[Callable[[], None]] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack)

    def record(self, label: str, io: bool, seconds: float) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # e.g. the run's watch thread: its round trips overlap the run's own
        step = self.steps.setdefault(label, Step(label, io))
        step.seconds += seconds
        step.calls += 1

    def wrap(
        self, owner: Any, name: str, label: str | Callable[..., str], *, io: bool = False
    ) -> None:
        """Time every call of `owner.name` under `label` (or `label(*args, **kwargs)`)."""
        original = getattr(owner, name)
        had_own = name in vars(owner)

        def timed(*args: Any, **kwargs: Any) -> Any:
            # Labelled before the call: a pipeline's command stack is gone once it has run.
            text = label(*args, **kwargs) if callable(label) else label
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.record(text, io, time.perf_counter() - start)

        setattr(owner, name, timed)
        if had_own:
            self._undo.append(lambda: setattr(owner, name, original))
        else:
            self._undo.append(lambda: delattr(owner, name))

    def wrap_context(self, owner: Any, name: str, label: str) -> None:
        """Time entering and leaving the context managers that `owner.name(...)` returns."""
        original = getattr(owner, name)
        timer = self

        @contextmanager
        def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
            start = time.perf_counter()
            with original(*args, **kwargs) as value:
                timer.record(f"{label}: enter", False, time.perf_counter() - start)
                try:
                    yield value
                finally:
                    start = time.perf_counter()
            timer.record(f"{label}: exit", False, time.perf_counter() - start)

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def wrap_if_present(
        self, owner: Any, name: str, label: str | Callable[..., str], *, io: bool = False
    ) -> None:
        """Like `wrap`, for code that other sessions are still reshaping: absent, nothing."""
        if hasattr(owner, name):
            self.wrap(owner, name, label, io=io)

    def _sql(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            verb = sql.lstrip().split(None, 1)[0].upper()
            self.record(f"sql {verb}", True, time.perf_counter() - start)

    def __enter__(self) -> StepTimer:
        db = connections["default"]
        self._stack.enter_context(db.execute_wrapper(self._sql))
        self.wrap(db, "_commit", "sql COMMIT", io=True)
        # With CONN_HEALTH_CHECKS, the first query after close_old_connections() is preceded by
        # a `SELECT 1` on the raw connection, which execute wrappers do not see.
        self.wrap(db, "is_usable", "sql health check (SELECT 1)", io=True)
        self.wrap(redis.Redis, "execute_command", _redis_label, io=True)
        self.wrap(redis.client.Pipeline, "execute", _pipeline_label, io=True)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()
        self._stack.close()

    def table(self, total_label: str, runs: int) -> list[str]:
        """Rows in ms per run, round trips first; "python" = total minus round trips."""
        total = self.steps[total_label].seconds
        io_seconds = sum(s.seconds for s in self.steps.values() if s.io)
        rows = [f"    {'step':<44} {'ms/run':>8} {'calls/run':>10}"]
        ordered = sorted(self.steps.values(), key=lambda s: (s.label != total_label, -s.seconds))
        for step in ordered:
            kind = "io" if step.io else "  "
            rows.append(
                f"    {kind} {step.label:<41} {1000 * step.seconds / runs:>8.3f}"
                f" {step.calls / runs:>10.2f}"
            )
        python_seconds = total - io_seconds
        rows.append(f"       {'round trips, all':<41} {1000 * io_seconds / runs:>8.3f}")
        rows.append(
            f"       {'python (total - round trips)':<41} {1000 * python_seconds / runs:>8.3f}"
        )
        return rows


def _redis_label(client: redis.Redis, *args: Any, **options: Any) -> str:
    db = client.connection_pool.connection_kwargs.get("db", 0)
    return f"redis {str(args[0]).upper()} (db {db})"


def _pipeline_label(pipeline: Any, *args: Any, **kwargs: Any) -> str:
    db = pipeline.connection_pool.connection_kwargs.get("db", 0)
    commands = "+".join(str(c[0][0]).upper() for c in pipeline.command_stack) or "empty"
    return f"redis pipeline {commands} (db {db})"
