"""The backlog's counts per stage and status, kept by triggers (`coverage.counts`): after every
kind of change, through the real paths, and under concurrent writers, they equal a real
GROUP BY of the rows."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from coverage import backlog, catalog, counts
from coverage.models import CoverageStageCountDelta, MediaItem, MediaItemStageState
from coverage.sweep import Sweep
from orchestrator.clock import FrozenClock
from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tests.support.catalog import empty_queues, movie, only_test_stages_driven

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = "test-probe"


@pytest.fixture(autouse=True)
def _test_stages() -> Iterator[None]:
    # Only the test stages are driven here; the configuration is put back for later tests
    # (test_coverage_demo's sweep drives the demo stages).
    coverage = settings.COVERAGE
    only_test_stages_driven()
    yield
    settings.COVERAGE = coverage
    empty_queues()


def _grouped() -> dict[tuple[str, str], int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT stage, status, count(*) FROM media_item_stage_state GROUP BY stage, status"
        )
        return {(stage, status): n for stage, status, n in cursor.fetchall()}


def _assert_exact() -> None:
    kept = {key: n for key, n in counts.read().items() if n != 0}
    assert kept == _grouped()


def _tick() -> None:
    Sweep(FrozenClock(timezone.now())).tick()


def _row(item: MediaItem, stage: str = STAGE) -> MediaItemStageState:
    return MediaItemStageState.objects.get(item=item, stage=stage)


def test_the_counts_follow_every_path_that_moves_a_row() -> None:
    items = [movie(f"m{n}") for n in range(6)]
    movie("no file", file=False)
    _assert_exact()  # the outbox has not made the rows yet: none counted

    _tick()  # seeds every stage's rows, disposes of the ineligible, starts the due: inserts, moves
    assert _row(items[0]).status == "running"
    _assert_exact()

    # A run's terminal write moves its row (the run triggers, migration 0006).
    TaskHistory.objects.filter(id=_row(items[0]).run_id).update(
        state=RunState.COMPLETED, finished_at=timezone.now(), result={"ok": True}
    )
    assert _row(items[0]).status == "completed"
    _assert_exact()

    # Heal: skipped rows whose eligibility holds again become pending.
    MediaItemStageState.objects.filter(item__in=items[1:3], stage=STAGE).update(
        status="skipped_permanent", reason="ineligible"
    )
    _assert_exact()
    assert backlog.heal(STAGE) == 2
    _assert_exact()

    # Rescan: the row is bound to a new run at once.
    MediaItemStageState.objects.filter(item=items[3], stage=STAGE).update(status="completed")
    backlog.rescan(STAGE, items[3].pk, {"kind": TriggerKind.API.value, "actor": "test"})
    _assert_exact()

    counts.fold()
    assert not CoverageStageCountDelta.objects.exists()
    _assert_exact()

    # An item's deletion cascades to its rows; a row deleted on its own.
    items[4].delete()
    MediaItemStageState.objects.filter(item=items[5], stage=STAGE).delete()
    _assert_exact()

    # An update that moves no status leaves no delta.
    counts.fold()
    MediaItemStageState.objects.update(updated_at=timezone.now())
    assert not CoverageStageCountDelta.objects.exists()

    _tick()  # the tick folds the deltas in, and the base is exact on its own
    assert not CoverageStageCountDelta.objects.exists()
    _assert_exact()


def test_the_backlog_page_api_and_metrics_read_the_kept_counts() -> None:
    items = [movie(f"m{n}") for n in range(3)]
    _tick()
    MediaItemStageState.objects.filter(item=items[0], stage=STAGE).update(status="completed")

    probe = next(s for s in backlog.overview() if s.stage == STAGE)

    assert probe.counts["completed"] == 1
    assert probe.counts["running"] == 2
    assert CoverageStageCountDelta.objects.exists()  # read before any fold: base + deltas


def test_concurrent_writers_then_a_fold_stay_exact() -> None:
    items = [movie(f"c{n}") for n in range(40)]
    _tick()
    rows = list(MediaItemStageState.objects.filter(stage=STAGE).values_list("id", flat=True))
    halves = (rows[::2], rows[1::2])
    statuses = ("completed", "pending", "failed_transient", "skipped_permanent", "obsolete")
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def writer(ids: list[int], offset: int) -> None:
        try:
            start.wait()
            for turn in range(60):
                with transaction.atomic():
                    for step, row_id in enumerate(ids[:5]):
                        status = statuses[(turn + step + offset) % len(statuses)]
                        MediaItemStageState.objects.filter(id=row_id).update(status=status)
                    MediaItemStageState.objects.filter(id__in=ids[5:]).update(
                        status=statuses[(turn + offset) % len(statuses)]
                    )
                # Rows made and deleted too, a few per statement.
                extra = f"extra-{offset}"
                if turn % 3 == 0:
                    MediaItemStageState.objects.bulk_create(
                        MediaItemStageState(item=item, stage=extra) for item in items[turn % 7 :]
                    )
                elif turn % 3 == 2:
                    MediaItemStageState.objects.filter(stage=extra).delete()
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(half, n)) for n, half in enumerate(halves)]
    for thread in threads:
        thread.start()
    start.wait()
    while any(thread.is_alive() for thread in threads):
        counts.fold()  # folds racing the writers: none lost, none counted twice
    for thread in threads:
        thread.join()

    assert errors == []
    _assert_exact()
    counts.fold()
    assert not CoverageStageCountDelta.objects.exists()
    _assert_exact()


def test_a_row_write_never_waits_on_another_transactions_count() -> None:
    """Two runs ending at once, each in its own open transaction, with the same (stage,
    status) move: the second commits while the first still holds its transaction open."""
    first, second = movie("first"), movie("second")
    _tick()
    held = threading.Event()
    release = threading.Event()

    def other_run() -> None:
        try:
            with transaction.atomic():
                MediaItemStageState.objects.filter(item=first, stage=STAGE).update(
                    status="completed"
                )
                held.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_run)
    thread.start()
    try:
        assert held.wait(10)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '1s'")
            MediaItemStageState.objects.filter(item=second, stage=STAGE).update(status="completed")
            counts.fold()  # nor does the fold wait on the open transaction's delta
    finally:
        release.set()
        thread.join()
    _assert_exact()


def test_a_truncate_empties_the_counts() -> None:
    movie("gone")
    _tick()
    counts.fold()
    movie("gone too")
    _tick()

    catalog.clear()

    assert counts.read() == {}


def test_recount_mends_counts_a_trigger_missed() -> None:
    items = [movie(f"r{n}") for n in range(3)]
    _tick()
    with connection.cursor() as cursor:
        # A bulk path writes rows with the triggers off.
        cursor.execute("ALTER TABLE media_item_stage_state DISABLE TRIGGER USER")
        try:
            MediaItemStageState.objects.filter(item=items[0]).update(status="completed")
            MediaItemStageState.objects.filter(item=items[1]).delete()
        finally:
            cursor.execute("ALTER TABLE media_item_stage_state ENABLE TRIGGER USER")
    assert {k: n for k, n in counts.read().items() if n} != _grouped()

    out = io.StringIO()
    call_command("coverage_recount", stdout=out)
    assert f"{STAGE} completed: 1" in out.getvalue()

    assert not CoverageStageCountDelta.objects.exists()
    _assert_exact()
    assert counts.read()[(STAGE, "completed")] == 1


def test_the_demo_catalog_load_leaves_exact_counts() -> None:
    catalog.load(300, seed=3)

    _assert_exact()
    assert sum(counts.read().values()) > 0
    # A later change lands on top of the loaded counts.
    some = MediaItemStageState.objects.order_by("id").first()
    assert some is not None
    MediaItemStageState.objects.filter(id=some.pk).update(
        status="completed", next_eligible_at=timezone.now() + timedelta(days=1)
    )
    _assert_exact()
