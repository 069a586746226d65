"""Progress: coalesced writes, a rate and an ETA, in the live hash, on the row and over HTTP."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator

import pytest
from django.conf import settings

from orchestrator.models import TaskHistory
from orchestrator.runs.progress import Progress
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from tests.support.round_trips import recording

pytestmark = pytest.mark.django_db(transaction=True)

RUN = "run_01PROGRESS0000000000000000"


@pytest.fixture
def running() -> Iterator[str]:
    TaskHistory.objects.create(
        id=RUN, task_id="test-noop", priority=5, identity="p", state=RunState.ACTIVE
    )
    valkey.client().hset(keys.run_active(RUN), "state", "active")
    yield RUN
    valkey.client().delete(keys.run_active(RUN))


def _live() -> dict[str, object]:
    return json.loads(valkey.client().hget(keys.run_active(RUN), "progress") or "null")


def test_a_thousand_fast_reports_cost_one_write(running: str) -> None:
    progress = Progress(running)

    with recording() as recorded:
        for done in range(1000):
            progress.report(done, 1000, item=f"file {done}")

    counts = recorded.counts()
    assert counts.valkey == 1  # the first; the rest waited inside the 250 ms window
    assert counts.postgres == 0
    progress.flush()  # what the watch tick does a moment later
    assert _live()["done"] == 999 and _live()["item"] == "file 999"


def test_the_rate_and_eta_follow_the_reports(running: str) -> None:
    progress = Progress(running)
    progress.report(0, 100)
    time.sleep(0.3)
    progress.report(30, 100)  # about 100 per second

    written = _live()
    rate = written["rate"]
    assert isinstance(rate, float) and 50 < rate < 150
    eta = written["eta_s"]
    assert isinstance(eta, float) and 0.3 < eta < 1.6
    assert written["at"] is not None


def test_the_row_is_forced_at_its_interval_while_progress_changes(running: str) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, progress_force_s=1)
    try:
        progress = Progress(running)
        progress.report(1, 10)
        progress.write_row()  # what the watch's Postgres beat does
        assert TaskHistory.objects.get(id=running).progress is None  # not due yet
        time.sleep(1.1)
        progress.report(5, 10)
        progress.write_row()
    finally:
        settings.CONFIG = dataclasses.replace(settings.CONFIG, progress_force_s=30)

    kept = TaskHistory.objects.get(id=running).progress
    assert kept is not None and kept["done"] == 5 and kept["total"] == 10


@pytest.mark.parametrize(
    ("done", "total", "error"),
    [("many", None, TypeError), (-1, None, ValueError), (1, float("nan"), ValueError)],
)
def test_bad_reports_are_refused_clearly(done: object, total: object, error: type) -> None:
    with pytest.raises(error, match="report_progress"):
        Progress(RUN).report(done, total)  # type: ignore[arg-type]


def test_a_report_after_the_run_ended_writes_nothing_back(running: str) -> None:
    valkey.client().delete(keys.run_active(running))
    progress = Progress(running)
    progress.report(1, 2)
    assert not valkey.client().exists(keys.run_active(running))  # not brought back to life
