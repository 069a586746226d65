"""The stage-sweep, one tick at a time, on a real catalog in Postgres.

Runs the sweep starts are published, and taken by no worker here: their rows stay `running`
(the run's insert marked them), which is what these tests look at. The run ↔ row mapping on
real workers is in test_coverage_runs.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from coverage.models import CoverageStage, MediaFile, MediaItem, MediaItemStageState
from coverage.sweep import Sweep, TickReport
from orchestrator.clock import FrozenClock
from orchestrator.models import TaskHistory
from orchestrator.routing import class_queues
from orchestrator.stores import broker, keys
from tasks import registry
from tests.support.catalog import empty_queues, movie, only_test_stages_driven

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = "test-probe"


@pytest.fixture(autouse=True)
def _empty_queues() -> Iterator[None]:
    """Only the test stages start runs; the runs wait in their queues, emptied after each
    test, and the configuration a test's ticks changed is put back."""
    coverage = settings.COVERAGE
    only_test_stages_driven()
    yield
    settings.COVERAGE = coverage
    empty_queues()


def _item(
    title: str = "item",
    *,
    kind: str = "movie",
    file: bool = True,
    missing: bool = False,
    parent: MediaItem | None = None,
) -> MediaItem:
    if kind == "movie":
        return movie(title, file=file, missing=missing)
    return MediaItem.objects.create(kind=kind, library="TV", title=title, parent=parent)


def _row(item: MediaItem, status: str, stage: str = STAGE, **fields: Any) -> MediaItemStageState:
    """A row as it was left a little while ago (due now, unless `next_eligible_at` says)."""
    fields.setdefault("next_eligible_at", timezone.now() - timedelta(minutes=2))
    return MediaItemStageState.objects.create(item=item, stage=stage, status=status, **fields)


def _status(item: MediaItem, stage: str = STAGE) -> MediaItemStageState:
    return MediaItemStageState.objects.get(item=item, stage=stage)


def _tick(clock: FrozenClock | None = None, **config: Any) -> TickReport:
    if config:
        settings.COVERAGE = dataclasses.replace(settings.COVERAGE, **config)
    return Sweep(clock or FrozenClock(timezone.now())).tick()


@dataclass(frozen=True)
class Case:
    label: str
    status: str  # the row before the tick ("none": no row)
    expected: str  # the row after it
    file: bool = True
    missing: bool = False
    due: bool = True
    reason: str = ""


TABLE = (
    Case("pending", "pending", "running"),
    Case("obsolete", "obsolete", "running"),
    Case("failed-transient-due", "failed_transient", "running"),
    Case("failed-transient-later", "failed_transient", "failed_transient", due=False),
    Case("skipped-transient-due", "skipped_transient", "running"),
    Case("healed", "skipped_permanent", "running", reason="ineligible"),
    Case("healed-extra-reason", "skipped_permanent", "running", reason="no-cover"),
    Case("still-ineligible", "skipped_permanent", "skipped_permanent", file=False,
         reason="ineligible"),
    Case("skipped-for-good", "skipped_permanent", "skipped_permanent", reason="drm"),
    Case("completed", "completed", "completed"),
    Case("failed-permanent", "failed_permanent", "failed_permanent"),
    Case("disposed-missing-file", "pending", "skipped_permanent", missing=True),
    Case("disposed-no-file", "pending", "skipped_permanent", file=False),
    Case("seeded", "none", "running"),
    Case("seeded-ineligible", "none", "skipped_permanent", file=False),
)  # fmt: skip


def test_one_tick_moves_each_row_as_its_status_says() -> None:
    clock = FrozenClock(timezone.now())
    items = {}
    for case in TABLE:
        item = _item(case.label, file=case.file, missing=case.missing)
        items[case.label] = item
        if case.status != "none":
            due = (
                clock.now() - timedelta(minutes=1) if case.due else clock.now() + timedelta(hours=1)
            )
            _row(item, case.status, reason=case.reason, next_eligible_at=due, processing_version=1)

    report = _tick(clock)

    after = {case.label: _status(items[case.label]) for case in TABLE}
    assert {label: row.status for label, row in after.items()} == {
        case.label: case.expected for case in TABLE
    }
    assert after["disposed-missing-file"].reason == "ineligible"
    assert after["seeded-ineligible"].reason == "ineligible"
    running = {label: row for label, row in after.items() if row.status == "running"}
    for label, row in running.items():
        run = TaskHistory.objects.get(id=row.run_id)
        assert run.task_id == "test-cover", label
        assert run.trigger["idempotencyKey"] == f"coverage:{STAGE}:{items[label].pk}", label
        assert run.input == {"stage": STAGE, "item_id": items[label].pk}, label
        assert run.priority == 7, label
    assert report.started[STAGE] == len(running) == 7
    assert report.disposed[STAGE] == 2
    assert report.healed[STAGE] == 2
    assert report.seeded[STAGE] == 2
    assert CoverageStage.objects.get(id=STAGE).last_tick["started"] == 7


def test_a_stage_starts_at_most_its_share_and_the_tick_at_most_the_ceiling() -> None:
    items = [_item(f"m{n}") for n in range(12)]
    seasons = [_item(f"s{n}", kind="season", file=False, parent=_series()) for n in range(6)]
    for item in items:
        _row(item, "pending")
    for season in seasons:
        _row(season, "pending", stage="test-season")

    report = _tick(starts_per_stage=5, starts_per_tick=8)

    assert report.started[STAGE] == 5
    assert report.started["test-season"] == 3
    assert MediaItemStageState.objects.filter(stage=STAGE, status="running").count() == 5
    # FIFO: the oldest due rows went first.
    first = sorted(items, key=lambda i: _status(i).next_eligible_at)[:5]
    assert all(_status(item).status == "running" for item in first)


def test_the_oldest_due_rows_go_first() -> None:
    now = timezone.now()
    late, early = _item("late"), _item("early")
    _row(late, "pending", next_eligible_at=now - timedelta(minutes=1))
    _row(early, "pending", next_eligible_at=now - timedelta(hours=1))

    _tick(starts_per_stage=1)

    assert _status(early).status == "running"
    assert _status(late).status == "pending"


def test_a_class_over_its_depth_threshold_is_skipped_for_the_tick() -> None:
    item = _item("waits")
    _row(item, "pending")
    queue = class_queues(registry.get().values(), "io", settings.CONFIG.per_task_queues)[0]
    broker.client().rpush(keys.broker_queue(queue, keys.BROKER_PRIORITY_STEPS[0]), *["x"] * 3)

    report = _tick(class_depth_threshold=2)

    assert "io" in report.skipped_classes
    assert report.started[STAGE] == 0
    assert _status(item).status == "pending"
    assert "classes skipped: io" in report.summary()
    assert CoverageStage.objects.get(id=STAGE).last_tick["class_skipped"] is True


def _series() -> MediaItem:
    return MediaItem.objects.create(kind="series", library="TV", title="show")


def test_a_season_waits_until_its_episodes_settle() -> None:
    clock = FrozenClock(timezone.now())
    season = MediaItem.objects.create(
        kind="season", library="TV", title="Season 1", parent=_series()
    )
    _row(season, "pending", stage="test-season")
    MediaItem.objects.create(kind="episode", library="TV", title="e1", parent=season)
    season.refresh_from_db()
    assert season.children_changed_at is not None  # the trigger saw the episode arrive

    _tick(clock, season_settle_s=1800)
    assert _status(season, "test-season").status == "pending"

    clock.advance(timedelta(minutes=29))
    _tick(clock)
    assert _status(season, "test-season").status == "pending"

    clock.advance(timedelta(minutes=2))
    _tick(clock)
    assert _status(season, "test-season").status == "running"


def test_dispose_then_heal_without_any_event() -> None:
    clock = FrozenClock(timezone.now())
    item = _item("flaky disk", missing=True)
    _row(item, "pending")

    _tick(clock)
    assert (_status(item).status, _status(item).reason) == ("skipped_permanent", "ineligible")

    # The file comes back behind the catalog's back: no trigger, no event.
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE media_files DISABLE TRIGGER USER")
        try:
            MediaFile.objects.filter(links__item=item).update(is_missing=False)
        finally:
            cursor.execute("ALTER TABLE media_files ENABLE TRIGGER USER")
    clock.advance(timedelta(minutes=1))
    report = _tick(clock)

    assert report.healed[STAGE] == 1
    assert _status(item).status == "running"


def test_the_heal_walk_resumes_where_it_stopped() -> None:
    items = [_item(f"h{n}") for n in range(5)]
    for item in items:
        _row(item, "skipped_permanent", reason="ineligible")

    healed = [_tick(heal_per_tick=2).healed[STAGE] for _ in range(3)]

    assert healed == [2, 2, 1]
    assert CoverageStage.objects.get(id=STAGE).heal_cursor == 0  # the walk starts over


def test_self_heal_gives_rows_to_at_most_its_batch_of_items_per_tick() -> None:
    items = [_item(f"n{n}") for n in range(7)]
    MediaItemStageState.objects.filter(stage=STAGE).delete()

    first = _tick(seed_per_tick=4, starts_per_stage=0)
    second = _tick(seed_per_tick=4, starts_per_stage=0)

    assert first.seeded[STAGE] == 4
    assert second.seeded[STAGE] == 3
    assert MediaItemStageState.objects.filter(stage=STAGE, item__in=items).count() == 7


def test_a_predicate_decides_once_when_the_row_is_made() -> None:
    tv = MediaItem.objects.create(kind="series", library="TV", title="on tv")
    other = MediaItem.objects.create(kind="series", library="Kids", title="elsewhere")

    _tick()

    assert _status(tv, "test-libraries").status == "pending"
    assert _status(other, "test-libraries").status == "skipped_permanent"
    # Not enqueueable: nothing starts it.
    assert not TaskHistory.objects.filter(task_id="test-cover-season").exists()


def test_a_batch_stage_starts_one_run_for_its_candidates() -> None:
    albums = [
        MediaItem.objects.create(kind="album", library="Music", title=f"a{n}") for n in range(3)
    ]

    _tick()
    _tick()  # the live batch run holds the key: a second tick starts nothing new

    runs = TaskHistory.objects.filter(task_id="test-cover-batch")
    assert runs.count() == 1
    run = runs.get()
    assert run.trigger["idempotencyKey"] == "coverage:test-albums"
    assert sorted(run.input["item_ids"]) == sorted(a.pk for a in albums)
    assert {_status(a, "test-albums").run_id for a in albums} == {run.id}


def test_rows_running_for_a_run_that_is_gone_are_reclaimed() -> None:
    clock = FrozenClock(timezone.now())
    wedged, live_run, young = _item("wedged"), _item("live"), _item("young")
    long_ago = clock.now() - timedelta(minutes=11)
    _row(wedged, "running", run_id="run_gone", started_at=long_ago)
    _row(young, "running", run_id="run_gone_too", started_at=clock.now() - timedelta(minutes=1))
    pending_run = TaskHistory.objects.create(
        id="run_pending", task_id="test-cover", priority=7, identity="x", state="pending"
    )
    _row(live_run, "running", run_id=pending_run.id, started_at=long_ago)

    report = _tick(clock, starts_per_stage=0)

    assert report.wedged[STAGE] == 1
    row = _status(wedged)
    assert (row.status, row.failures) == ("failed_transient", 1)
    assert "wedged: run run_gone is no longer live" in row.last_error
    assert row.next_eligible_at >= clock.now() + timedelta(minutes=5)
    assert _status(young).status == "running"
    assert _status(live_run).status == "running"  # a run waiting behind a backlog is live


def test_a_new_processing_version_makes_completed_rows_obsolete() -> None:
    old, current = _item("old"), _item("current")
    _row(old, "completed", processing_version=1)
    _row(current, "completed", processing_version=2)
    CoverageStage.objects.create(id=STAGE, task_id="test-cover", processing_version=1)
    installed = registry.get()
    bumped = dataclasses.replace(installed["test-cover"], processing_version=2)
    tasks = {**installed, "test-cover": bumped}
    registry.install(
        registry.Registry(tasks.values(), installed.triggers.values(), installed.limits.values())
    )
    try:
        report = _tick(starts_per_stage=0)
    finally:
        registry.install(installed)  # the very registry, its triggers with it

    assert report.obsoleted[STAGE] == 1
    assert _status(old).status == "obsolete"
    assert _status(current).status == "completed"
    assert CoverageStage.objects.get(id=STAGE).processing_version == 2
    assert _tick(starts_per_stage=0).obsoleted[STAGE] == 0  # once per version change
