"""A run's progress, its rate and its ETA, written as often as is useful and no more.

`ctx.report_progress(done, total=None, item=None)` may be called in a tight loop. The latest
report always wins, but it reaches:
- the live hash (`progress` field, `set_progress.lua`, and a `progress` event for the
  followers of `GET /events`) at most once per
  LUMASTRA_PROGRESS_WRITE_S (0.25 s): a report inside that window waits, and the watch tick
  (about once a second) or the run's end sends it;
- the run's row (`task_history.progress`) at least every LUMASTRA_PROGRESS_FORCE_S (30 s)
  while it keeps changing, and with the run's terminal write.

What is written: `done`, `total`, `item` (what the handler is on), `rate` (done per second,
smoothed over the writes) and `eta_s` (seconds left at that rate, when there is a total).

Not guaranteed: a report made just before the process dies is lost (at most 250 ms of them);
the rate follows the reports, so a handler that reports unevenly gets an uneven ETA.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any

from django.conf import settings

from orchestrator.clock import SYSTEM, Clock
from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from orchestrator.stores import keys, live, valkey

log = logging.getLogger(__name__)

# Weight of the newest interval in the smoothed rate.
RATE_WEIGHT = 0.3
MAX_ITEM = 200


class Progress:
    def __init__(
        self, run_id: str, clock: Clock = SYSTEM, sends: valkey.HandlerSends | None = None
    ) -> None:
        self.run_id = run_id
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: dict[str, Any] | None = None
        self._waiting = False
        self._hash_written_at = 0.0  # monotonic
        self._row_written_at = time.monotonic()
        self._row_stale = False
        self._rate: float | None = None
        self._last_sample: tuple[float, float] | None = None  # (monotonic, done)
        self._sends = sends or valkey.HandlerSends()  # the handler thread's inline flushes

    def report(self, done: float, total: float | None = None, item: str | None = None) -> None:
        _check(done, total)
        with self._lock:
            self._latest = {
                "done": done,
                "total": total,
                "item": None if item is None else str(item)[:MAX_ITEM],
            }
            self._waiting = True
            self._row_stale = True
            now = time.monotonic()
            due = now - self._hash_written_at >= settings.CONFIG.progress_write_s
        if due and self._sends.open:
            try:
                self._sends.send(self.flush)
            except Exception:
                # Reporting must not fail the handler: the report waits for the watch's flush.
                log.warning("run %s: progress not written yet", self.run_id, exc_info=True)

    def flush(self, *, final: bool = False) -> None:
        """Send the latest report to the live hash if one waits (the watch tick calls this).
        `final`: the run is ending (its terminal write takes the row's copy, `document`)."""
        now = time.monotonic()
        with self._lock:
            if not self._waiting or self._latest is None:
                return
            self._waiting = False
            self._hash_written_at = now
            document = self._with_rate(now)
        try:
            event = {"type": "progress", "run_id": self.run_id, "progress": document}
            valkey.script_with(
                "set_progress",
                [keys.run_active(self.run_id)],
                [json.dumps(document), valkey.to_ms(self._clock.now())],
                lambda pipe: live.queue_event(pipe, event),
            )
        except Exception:
            with self._lock:  # the report waits for the next flush
                self._waiting = True
            raise

    def write_row(self) -> None:
        """The row's forced write, when due: at least every LUMASTRA_PROGRESS_FORCE_S while the
        progress keeps changing. Apart from `flush`, on the watch's Postgres thread, so a store
        that hangs holds up only its own writes (`runs.watch`)."""
        now = time.monotonic()
        with self._lock:
            if (
                self._latest is None
                or not self._row_stale
                or now - self._row_written_at < settings.CONFIG.progress_force_s
            ):
                return
            self._row_written_at = now
            self._row_stale = False
            document = self._with_rate(now, sample=False)
        try:
            # The row's progress column only (the run's state is the writer's, `durable`).
            TaskHistory.objects.filter(id=self.run_id, state=RunState.ACTIVE).update(
                progress=document
            )
        except Exception:
            with self._lock:  # written at the next beat
                self._row_stale = True
            raise

    def document(self) -> dict[str, Any] | None:
        """The latest progress, for the run's terminal write; None if it never reported."""
        with self._lock:
            if self._latest is None:
                return None
            return self._with_rate(time.monotonic(), sample=False)

    def _with_rate(self, now: float, *, sample: bool = True) -> dict[str, Any]:
        assert self._latest is not None
        done, total = self._latest["done"], self._latest["total"]
        if sample:
            if self._last_sample is not None and now > self._last_sample[0]:
                interval = (done - self._last_sample[1]) / (now - self._last_sample[0])
                self._rate = (
                    interval
                    if self._rate is None
                    else RATE_WEIGHT * interval + (1 - RATE_WEIGHT) * self._rate
                )
            self._last_sample = (now, done)
        rate = self._rate
        eta = None
        if rate and rate > 0 and total is not None:
            eta = max(0.0, (total - done) / rate)
        return {
            **self._latest,
            "rate": None if rate is None else round(rate, 4),
            "eta_s": None if eta is None else round(eta, 1),
            "at": self._clock.now().isoformat(),
        }


def _check(done: float, total: float | None) -> None:
    for name, value in (("done", done), ("total", total)):
        if value is None and name == "total":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"report_progress: {name} must be a number")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"report_progress: {name} must be finite and >= 0, not {value}")
