"""A run's live log: what its handler says (`ctx.log`, and its own `logging` calls while it
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
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings

from orchestrator.clock import SYSTEM, Clock, span_ms
from orchestrator.stores import keys, valkey

LOG_TTL = timedelta(hours=24)
MAX_MESSAGE = 4000
# Loggers whose records are the engine's or Celery's, never a run's.
log = logging.getLogger(__name__)
ENGINE_LOGGERS = frozenset({"orchestrator", "celery", "kombu", "billiard", "amqp", "django"})


@dataclass(frozen=True)
class Line:
    seq: int
    entry: dict[str, Any]

    @classmethod
    def parse(cls, stored: str) -> Line | None:
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


def read(run_id: str, after: int = 0) -> list[Line]:
    """The run's lines still in Valkey with a seq above `after`, oldest first."""
    stored: list[str] = valkey.client().lrange(keys.run_log(run_id), 0, -1)  # type: ignore[assignment]
    return parsed(stored, after)


def parsed(stored: list[str], after: int = 0) -> list[Line]:
    """Lines as `task:log:<runId>` holds them, those with a seq above `after`."""
    return [line for line in map(Line.parse, stored) if line is not None and line.seq > after]


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
