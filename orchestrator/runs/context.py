"""The engine's implementation of the SDK's `TaskContext`, and the run's live log.

The live log (`RunLog`): what its handler says (`ctx.log`, and its own `logging` calls while it
runs), kept in Valkey for followers and as a tail on the run's row for later.

Each line is an entry `{"ts", "level", "stage", "msg"}` numbered in the run's own sequence
(`seq`, from 1, never reused, whichever process or attempt wrote it) in `task:log:<runId>`:
the last LUMASTRA_LOG_CAP lines, for 24 hours (`log_append.lua`). Lines are sent in batches:
when LUMASTRA_LOG_FLUSH_LINES are waiting, when the oldest waiting line is
LUMASTRA_LOG_FLUSH_S old at the next write, at each watch tick (about once a second) and at
the run's end, so a chatty handler costs a round trip per batch, not per line. Each batch is
announced on `<namespace>:task:logfeed:<runId>` for the followers (`orchestrator.api.logs`).

`logging` records are taken from the thread running the handler only, and only while it
runs (`capturing`), at LUMASTRA_RUN_LOG_LEVEL and above, and not from the engine's own
loggers or Celery's: another run's records, or the worker's, never land in this run's log.

The last LUMASTRA_RUN_LOG_TAIL lines an attempt wrote are kept on its step record
(`log_tail`, written with the run's terminal write), so the log of a run older than a day can
still be read.

Not guaranteed: lines waiting in a process that is killed are lost (up to one batch); an
attempt's tail holds only its own lines (a retry's tail does not repeat the first attempt's).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from orchestrator.clock import SYSTEM, Clock, span_ms
from orchestrator.hooks import costs, limits
from orchestrator.runs import process, spawn
from orchestrator.runs.progress import Progress
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from tasks import registry
from tasks.context import ChildRun
from tasks.errors import ErrorKind, LimitReached, PermanentError, RunCancelled
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
        priority: int | None = None,
        spawns: bool = True,
    ) -> None:
        self._run_id = run_id
        self._stage = stage
        self._priority = priority
        self._spawns = spawns  # False: not a step (a stage's `when`), so no child can be written
        # The children this attempt spawned, written with its step's end (`runs.spawn`).
        self.spawned: list[spawn.Spawn] = []
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
        # Set with it when the run's window closed (on_close="stop"): put back, not cancelled.
        self.stopped_for_window = False
        # Set when `limit` gave up waiting: the run goes back to pending for this long.
        self.limited_for: timedelta | None = None
        # monotonic time of the last sign of progress, read by the stall watchdog.
        self.progressed_at = time.monotonic()
        self._state_read_at = 0.0

    def trip_cancel(self) -> None:
        self._cancel.set()

    def stop_for_window(self) -> None:
        """The handler is asked to stop as a cancel asks it (`raise_if_cancelled`, `sleep`);
        the run then goes back to pending, its attempt not spent (`runs.execute`)."""
        self.stopped_for_window = True
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

    def spawn(
        self,
        task_id: str,
        inputs: Sequence[Mapping[str, Any]],
        *,
        on_failure: str = "fail_parent",
        priority: int | None = None,
    ) -> list[str]:
        """`TaskContext.spawn` (`runs.spawn`)."""
        if not self._spawns:
            raise PermanentError("spawn: only a handler or a stage's `execute` may spawn")
        parent = spawn.Parent(self._run_id, self._stage or "", self._priority)
        return spawn.spawn(parent, self.spawned, task_id, inputs, on_failure, priority)

    def children(self, stage: str) -> list[ChildRun]:
        """`TaskContext.children` (`runs.spawn`)."""
        return spawn.children_of(self._run_id, stage)

    @contextmanager
    def limit(self, limit_id: str, units: int = 1) -> Iterator[None]:
        """`TaskContext.limit`: this run's units of a named limit (`hooks.limits`)."""
        declared = registry.get().limits
        if limit_id not in declared:
            raise PermanentError(f"limit {limit_id!r} is not declared (define_limit)")
        limit = declared[limit_id]
        most = min(n for n in (limit.concurrency, limit.rate and limit.rate.count) if n)
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= most:
            raise PermanentError(f"limit {limit_id!r}: units must be from 1 to {most}")
        held = [limits.Held(limit, limit.key_of(self._input))]
        token = f"{self._run_id}|{uuid.uuid4().hex}"
        lease = limits.lease_of(registry.get()[self._task_id])
        deadline = time.monotonic() + limit.wait_s
        while not (answer := limits.take(held, token, units, lease, self._run_id)).taken:
            delay = answer.delay()
            if time.monotonic() + delay.total_seconds() > deadline:
                self.limited_for = delay
                raise LimitReached(f"limit {limit_id!r} had no room within {limit.wait_s:g} s")
            self.sleep(delay.total_seconds())
        try:
            yield
        finally:
            limits.give_back(held, token, units, admissions=False)

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


LOG_TTL = timedelta(hours=24)
MAX_MESSAGE = 4000
# Loggers whose records are the engine's or Celery's, never a run's.
ENGINE_LOGGERS = frozenset({"orchestrator", "celery", "kombu", "billiard", "amqp", "django"})


@dataclass(frozen=True)
class LogLine:
    seq: int
    entry: dict[str, Any]

    @classmethod
    def parse(cls, stored: str) -> LogLine | None:
        """A stored line, or None for one this version cannot read (a plain line an older
        version wrote)."""
        seq, _, text = stored.partition("\t")
        if not seq.isdigit():
            return None
        return cls(int(seq), json.loads(text))


class RunLog:
    """The lines one attempt (or one stage's attempt) of a run writes, batched."""

    def __init__(
        self,
        run_id: str,
        stage: str | None = None,
        clock: Clock = SYSTEM,
        sends: valkey.HandlerSends | None = None,
    ) -> None:
        self.run_id = run_id
        self.stage = stage
        self._clock = clock
        self._waiting: list[str] = []
        self._oldest_waiting = 0.0
        self._lock = threading.Lock()
        # Held across taking a batch and sending it: two flushes (the watch tick's and a
        # write's) never interleave, so lines keep their order in the sequence.
        self._sending = threading.Lock()
        self.tail: deque[dict[str, Any]] = deque(maxlen=settings.CONFIG.run_log_tail)
        self._sends = sends or valkey.HandlerSends()  # the handler thread's inline flushes

    def write(self, level: str, message: str) -> None:
        entry = {
            "ts": self._clock.now().isoformat(),
            "level": level,
            "stage": self.stage,
            "msg": str(message)[:MAX_MESSAGE],
        }
        config = settings.CONFIG
        with self._lock:
            if not self._waiting:
                self._oldest_waiting = time.monotonic()
            self._waiting.append(json.dumps(entry))
            self.tail.append(entry)
            now = time.monotonic()
            due = (
                len(self._waiting) >= config.log_flush_lines
                or now - self._oldest_waiting >= config.log_flush_s
            )
        if due and self._sends.open:
            try:
                self._sends.send(self.flush)
            except Exception:
                # Logging must not fail the handler: the lines wait for the watch's flush.
                log.warning("run %s: log lines not sent yet", self.run_id, exc_info=True)

    def flush(self) -> None:
        """Send the waiting lines, if any (one round trip); on failure they wait for the next
        flush (at most a log's worth) and the error is raised."""
        with self._sending:
            with self._lock:
                lines, self._waiting = self._waiting, []
            if not lines:
                return
            cap = settings.CONFIG.log_cap
            try:
                valkey.script(
                    "log_append",
                    [keys.run_log(self.run_id), keys.run_log_seq(self.run_id)],
                    [cap, span_ms(LOG_TTL), keys.run_log_feed(self.run_id), *lines],
                )
            except Exception:
                with self._lock:
                    self._waiting[:0] = lines
                    del self._waiting[:-cap]
                raise


def read_log(run_id: str, after: int = 0) -> list[LogLine]:
    """The run's lines still in Valkey with a seq above `after`, oldest first."""
    stored: list[str] = valkey.client().lrange(keys.run_log(run_id), 0, -1)  # type: ignore[assignment]
    return parsed_log(stored, after)


def parsed_log(stored: list[str], after: int = 0) -> list[LogLine]:
    """Lines as `task:log:<runId>` holds them, those with a seq above `after`."""
    return [line for line in map(LogLine.parse, stored) if line is not None and line.seq > after]


# --- the handler's own `logging` records ---

_current: ContextVar[RunLog | None] = ContextVar("lumastra_run_log", default=None)


class _RunLogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        run_log = _current.get()
        if run_log is None or record.name.partition(".")[0] in ENGINE_LOGGERS:
            return
        try:
            run_log.write(record.levelname.lower(), self.format(record))
        except Exception:
            self.handleError(record)


_handler: _RunLogHandler | None = None


@contextmanager
def capturing(run_log: RunLog) -> Iterator[None]:
    """The handler's `logging` records go to `run_log` while this block runs in this thread."""
    global _handler
    if _handler is None:
        _handler = _RunLogHandler(level=settings.CONFIG.run_log_level)
        _handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logging.getLogger().addHandler(_handler)
    token = _current.set(run_log)
    try:
        yield
    finally:
        _current.reset(token)
