"""Run ↔ row on real workers: a coverage run's outcome reaches its item's row in the run's own
terminal transaction (migration 0004), whichever path ends the run."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from coverage.dispatcher import Dispatcher
from coverage.models import (
    CoverageStage,
    MediaFile,
    MediaFileItem,
    MediaItem,
    MediaItemStageState,
)
from coverage.sweep import Sweep, run_key
from orchestrator.clock import FrozenClock
from orchestrator.models import TaskHistory
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.routing import queue_name
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.start import start_run
from orchestrator.states import TERMINAL_RUN_STATES, RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.catalog import movie
from tests.support.fixtures import wait_for, worker_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

STAGE = "test-probe"
TERMINAL = [s.value for s in TERMINAL_RUN_STATES]


@pytest.fixture
def worker() -> Iterator[object]:
    queue = queue_name(registry.get()["test-cover"], settings.CONFIG.per_task_queues)
    with worker_process([queue], concurrency=2, name="cover") as process:
        yield process


def _item(title: str) -> MediaItem:
    return movie(title)


def _row(item: MediaItem) -> MediaItemStageState:
    return MediaItemStageState.objects.get(item=item, stage=STAGE)


def _ended(item: MediaItem) -> MediaItemStageState:
    def settled() -> MediaItemStageState | None:
        row = _row(item)
        run = TaskHistory.objects.filter(id=row.run_id).values_list("state", flat=True).first()
        return row if run in TERMINAL and row.status != "running" else None

    return wait_for(settled, timeout=30)


def test_each_outcome_reaches_the_row(worker: object) -> None:
    titles = ("done", "transient", "permanent", "skip", "skip-later")
    items = {title: _item(title) for title in titles}

    report = Sweep(FrozenClock(timezone.now())).tick()
    assert report.started[STAGE] == len(titles)
    rows = {title: _ended(item) for title, item in items.items()}

    assert {title: row.status for title, row in rows.items()} == {
        "done": "completed",
        "transient": "failed_transient",
        "permanent": "failed_permanent",
        "skip": "skipped_permanent",
        "skip-later": "skipped_transient",
    }
    now = timezone.now()
    assert rows["done"].processing_version == registry.get()["test-cover"].processing_version
    assert rows["done"].failures == 0 and rows["done"].last_error == ""
    transient = rows["transient"]
    assert transient.failures == 1
    assert transient.last_error.startswith("transient: item")
    assert now + timedelta(minutes=4) < transient.next_eligible_at < now + timedelta(minutes=6)
    assert rows["permanent"].last_error.startswith("permanent: item")
    assert rows["skip"].reason == "no-cover"
    assert rows["skip-later"].reason == "locked"
    assert rows["skip-later"].next_eligible_at > now + timedelta(minutes=9)
    for title, row in rows.items():
        assert row.run_id, title
        assert row.finished_at is not None, title


def test_a_cancelled_run_puts_its_row_back_to_pending(worker: object) -> None:
    item = _item("slow")
    Sweep().tick()
    run_id = wait_for(
        lambda: (
            TaskHistory.objects.filter(
                trigger__idempotencyKey=run_key(STAGE, item.pk), state=RunState.ACTIVE
            )
            .values_list("id", flat=True)
            .first()
        )
    )
    assert _row(item).status == "running"

    request_cancel(run_id, actor="test")

    row = _ended(item)
    assert row.status == "pending"
    # Not at once: an operator's cancel is not undone by the next tick.
    assert row.next_eligible_at > timezone.now() + timedelta(minutes=4)
    assert TaskHistory.objects.get(id=run_id).state == RunState.CANCELLED


def test_a_rescan_by_hand_binds_the_row_and_a_second_start_joins_it() -> None:
    item = _item("by hand")
    Sweep().tick()  # binds the stage to its task (coverage_stage) and seeds the row
    first_run = _row(item).run_id

    again = start_run(
        "test-cover",
        {"stage": STAGE, "item_id": item.pk},
        trigger=TriggerKind.API,
        idempotency_key=run_key(STAGE, item.pk),
    )

    assert again.run_id == first_run  # the live run holds its key: joined, not a second run
    assert TaskHistory.objects.filter(trigger__idempotencyKey=run_key(STAGE, item.pk)).count() == 1


def test_a_forged_key_for_a_stage_of_another_task_moves_no_row() -> None:
    item = _item("forged")
    Sweep(FrozenClock(timezone.now())).tick()
    MediaItemStageState.objects.filter(item=item).update(status="completed")

    start_run(
        "test-noop",
        {},
        trigger=TriggerKind.API,
        idempotency_key=run_key(STAGE, item.pk),
    )

    assert _row(item).status == "completed"


def test_the_terminal_write_and_the_row_commit_or_roll_back_together() -> None:
    item = _item("atomic")
    Sweep().tick()
    run_id = _row(item).run_id

    with transaction.atomic():
        TaskHistory.objects.filter(id=run_id).update(
            state=RunState.FAILED, error={"kind": "permanent", "message": "x"}
        )
        # Inside the run's transaction the row has moved already...
        assert _row(item).status == "failed_permanent"
        transaction.set_rollback(True)
    # ...and a crash before the commit undoes both.
    assert TaskHistory.objects.get(id=run_id).state == RunState.PENDING
    assert _row(item).status == "running"


def test_a_run_whose_worker_was_killed_leaves_its_row_failed_transient() -> None:
    item = _item("slow and doomed")
    queue = queue_name(registry.get()["test-cover"], settings.CONFIG.per_task_queues)
    with worker_process([queue], concurrency=1, name="cover-doomed") as process:
        Sweep().tick()
        run_id = _row(item).run_id
        wait_for(lambda: TaskHistory.objects.get(id=run_id).state == RunState.ACTIVE)
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        for pid in [*map(int, children), process.pid]:
            os.kill(pid, signal.SIGKILL)
        process.wait()
    # The worker is gone without a word: its run stops heartbeating and the reconciler ends it.
    stale = timezone.now() - timedelta(hours=1)
    TaskHistory.objects.filter(id=run_id).update(heartbeat_at=stale, started_at=stale)
    valkey.client().delete(keys.run_active(run_id))
    Reconciler().tick()

    run = TaskHistory.objects.get(id=run_id)
    assert run.state == RunState.FAILED
    row = _row(item)
    assert row.status == "failed_transient"
    assert row.last_error.startswith(f"{run.error['kind']}: ")
    assert row.failures == 1


def _end(run_id: str, state: RunState, **fields: object) -> None:
    """The run's terminal write as the engine sends it (the triggers do the rest)."""
    TaskHistory.objects.filter(id=run_id).update(state=state, finished_at=timezone.now(), **fields)


def test_an_item_that_changed_during_its_run_is_done_again() -> None:
    item = _item("changed underneath")
    Sweep().tick()
    run_id = _row(item).run_id
    MediaItem.objects.filter(pk=item.pk).update(title="renamed")  # not content: no rerun
    found = MediaFile.objects.create(path=f"/media/{item.pk}-second.mkv", size=2)
    MediaFileItem.objects.create(file=found, item=item)  # content: the run may be stale
    Dispatcher().tick()
    assert (_row(item).status, _row(item).rerun_requested) == ("running", True)

    _end(run_id, RunState.COMPLETED, result={"ok": True})

    row = _row(item)
    assert (row.status, row.rerun_requested) == ("pending", False)
    assert row.next_eligible_at <= timezone.now()


def test_a_run_that_completes_under_an_older_version_leaves_its_row_obsolete() -> None:
    item = _item("old code")
    Sweep().tick()
    run_id = _row(item).run_id
    CoverageStage.objects.filter(id=STAGE).update(processing_version=2)  # a deploy since

    _end(run_id, RunState.COMPLETED, result={"ok": True})

    assert _row(item).status == "obsolete"


def test_a_run_binds_only_the_row_its_key_names() -> None:
    mine, other = _item("mine"), _item("other")
    Sweep(FrozenClock(timezone.now())).tick()
    MediaItemStageState.objects.filter(item__in=[mine, other]).update(status="completed")

    start_run(
        "test-cover",
        {"stage": STAGE, "item_id": other.pk},
        trigger=TriggerKind.API,
        idempotency_key=run_key(STAGE, mine.pk),
    )

    assert _row(other).status == "completed"
    assert _row(mine).status == "completed"
