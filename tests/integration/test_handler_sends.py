"""The gate on a handler thread's own sends to Valkey: a slow or failed send shuts it for a
pause, for the run's log and progress alike, and the watch's flushes still send."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

from orchestrator.runs import context
from orchestrator.runs.progress import Progress
from orchestrator.stores import valkey
from tests.support.round_trips import recording

pytestmark = pytest.mark.django_db(transaction=True)

RUN = "run_01SENDS000000000000000000"


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _slow(clock: FakeMonotonic, seconds: float) -> None:
    clock.now += seconds


def _inline_round_trips(run_log: context.RunLog, progress: Progress) -> int:
    with recording() as recorded:
        for n in range(settings.CONFIG.log_flush_lines):
            run_log.write("info", f"line {n}")
        progress.report(1, 2)
    return recorded.counts().valkey


def test_a_slow_send_shuts_the_gate_for_the_log_and_the_progress_until_the_pause_ends() -> None:
    clock = FakeMonotonic()
    sends = valkey.HandlerSends(clock)
    run_log, progress = context.RunLog(RUN, sends=sends), Progress(RUN, sends=sends)
    # Open, they send inline (and load their scripts, which a cold server takes a trip for).
    run_log.write("info", "warm")
    run_log.flush()
    progress.report(0, 2)
    assert context.read_log(RUN)[-1].entry["msg"] == "warm"
    sends.send(lambda: _slow(clock, valkey.SLOW_SEND_S / 2))
    assert sends.open  # a send in time leaves it open

    sends.send(lambda: _slow(clock, valkey.SLOW_SEND_S * 2))
    assert not sends.open
    time.sleep(settings.CONFIG.progress_write_s)  # due again: only the gate holds it
    assert _inline_round_trips(run_log, progress) == 0

    # The watch's flush is not the handler's: it sends what waited.
    run_log.flush()
    assert len(context.read_log(RUN)) == 1 + settings.CONFIG.log_flush_lines

    clock.now += valkey.OUTAGE_PAUSE_S
    assert sends.open
    assert _inline_round_trips(run_log, progress) == 2  # one log batch, one progress write


def test_a_failed_send_shuts_the_gate_and_raises() -> None:
    clock = FakeMonotonic()
    sends = valkey.HandlerSends(clock)

    def unreachable() -> None:
        raise RedisConnectionError("no route to host")

    with pytest.raises(RedisConnectionError):
        sends.send(unreachable)
    assert not sends.open
    clock.now += valkey.OUTAGE_PAUSE_S
    assert sends.open
