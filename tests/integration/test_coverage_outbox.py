"""The invalidation outbox: catalog triggers write events in the change's transaction, the
dispatcher turns them into rows that need their stages again."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from coverage.dispatcher import Dispatcher, redeliver
from coverage.models import (
    EventOutbox,
    ExternalId,
    MediaFile,
    MediaFileItem,
    MediaItem,
    MediaItemStageState,
)
from coverage.stages import covered, sync
from orchestrator.clock import FrozenClock
from tests.support.catalog import movie

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = "test-probe"


@pytest.fixture(autouse=True)
def _bound_stages() -> None:
    sync(covered())


def _events() -> list[tuple[str, int]]:
    return sorted(EventOutbox.objects.values_list("kind", "item_id"))


def _row(item: MediaItem, stage: str = STAGE) -> MediaItemStageState:
    return MediaItemStageState.objects.get(item=item, stage=stage)


def test_each_catalog_change_writes_its_event() -> None:
    movie = MediaItem.objects.create(kind="movie", library="Movies", title="a")
    assert _events() == [("item.created", movie.pk)]
    EventOutbox.objects.all().delete()

    movie.title = "b"
    movie.save()
    movie.save()  # nothing the stages read changed: no second event
    found = MediaFile.objects.create(path="/media/a.mkv", size=1)
    link = MediaFileItem.objects.create(file=found, item=movie)
    MediaFile.objects.filter(pk=found.pk).update(content_hash="abc")
    MediaFile.objects.filter(pk=found.pk).update(is_missing=True)
    MediaFile.objects.filter(pk=found.pk).update(size=2)  # rewritten on disk
    MediaFile.objects.filter(pk=found.pk).update(path="/media/b.mkv")  # not read by a stage
    external = ExternalId.objects.create(item=movie, provider="tmdb", value="1")
    external.value = "2"
    external.save()
    external.delete()
    link.delete()

    assert list(EventOutbox.objects.order_by("id").values_list("kind", flat=True)) == [
        "item.metadata_changed",
        "file.linked",
        "file.content_changed",
        "file.presence_changed",
        "file.modified",
        "external_id.changed",
        "external_id.changed",
        "external_id.changed",
        "file.unlinked",
    ]
    assert set(EventOutbox.objects.values_list("item_id", flat=True)) == {movie.pk}


def test_a_child_added_or_removed_tells_its_parent() -> None:
    show = MediaItem.objects.create(kind="series", library="TV", title="show")
    season = MediaItem.objects.create(kind="season", library="TV", title="S1", parent=show)
    EventOutbox.objects.all().delete()
    MediaItem.objects.filter(pk=season.pk).update(children_changed_at=None)

    episode = MediaItem.objects.create(kind="episode", library="TV", title="e", parent=season)
    season.refresh_from_db()
    assert season.children_changed_at is not None
    assert ("children.changed", season.pk) in _events()

    EventOutbox.objects.all().delete()
    episode.delete()
    assert _events() == [("children.changed", season.pk)]


def test_a_rolled_back_change_leaves_no_event() -> None:
    with transaction.atomic():
        MediaItem.objects.create(kind="movie", library="Movies", title="never")
        transaction.set_rollback(True)
    assert _events() == []


def test_new_items_get_their_rows_from_the_dispatcher() -> None:
    eligible, without_file = movie("with file"), movie("no file", file=False)

    report = Dispatcher().tick()

    assert _row(eligible).status == "pending"
    assert (_row(without_file).status, _row(without_file).reason) == (
        "skipped_permanent",
        "ineligible",
    )
    assert report.seeded[STAGE] == 2
    assert EventOutbox.objects.count() == 0  # handled events are gone


def test_events_reset_the_rows_of_the_stages_that_declare_them() -> None:
    waiting = movie("no file yet", file=False)
    done, busy, failed = movie("done"), movie("busy"), movie("failed")
    Dispatcher().tick()
    MediaItemStageState.objects.filter(item=done).update(status="completed")
    MediaItemStageState.objects.filter(item=busy).update(status="running", run_id="run_x")
    MediaItemStageState.objects.filter(item=failed).update(status="failed_permanent")

    # Not content: a metadata edit wakes skipped rows only (this one is still not eligible).
    for item in (waiting, done, busy, failed):
        MediaItem.objects.filter(pk=item.pk).update(title=f"{item.title}!")
    Dispatcher().tick()
    assert _row(waiting).status == "skipped_permanent"
    assert _row(done).status == "completed"
    assert _row(failed).status == "failed_permanent"

    # Content: linking a file resets skipped (now eligible), completed and failed rows...
    for item in (waiting, done, busy, failed):
        found = MediaFile.objects.create(path=f"/media/extra-{item.pk}.mkv", size=1)
        MediaFileItem.objects.create(file=found, item=item)
    report = Dispatcher().tick()

    assert _row(waiting).status == "pending"
    assert _row(done).status == "pending"
    assert _row(failed).status == "pending"
    assert (_row(busy).status, _row(busy).run_id) == ("running", "run_x")  # ...never running ones
    assert report.reset[STAGE] == 3


def test_a_stage_hears_only_the_events_it_declares() -> None:
    album = MediaItem.objects.create(kind="album", library="Music", title="lp")
    Dispatcher().tick()
    MediaItemStageState.objects.filter(item=album, stage="test-albums").update(
        status="skipped_permanent", reason="ineligible"
    )

    MediaItem.objects.filter(pk=album.pk).update(title="lp (remaster)")
    Dispatcher().tick()

    assert _row(album, "test-albums").status == "skipped_permanent"  # invalidated_by is empty


def test_two_dispatchers_never_take_the_same_event() -> None:
    items = [movie(f"m{n}", file=False) for n in range(6)]
    EventOutbox.objects.all().delete()
    for item in items:
        MediaItem.objects.filter(pk=item.pk).update(title=f"{item.title}*")
    ids = list(EventOutbox.objects.order_by("id").values_list("id", flat=True))
    assert len(ids) == 6
    held, released = threading.Event(), threading.Event()

    def first_dispatcher_mid_batch() -> None:
        try:
            with transaction.atomic():
                list(EventOutbox.objects.select_for_update().filter(id__in=ids[:3]))
                held.set()
                released.wait(20)
        finally:
            connections.close_all()

    other = threading.Thread(target=first_dispatcher_mid_batch)
    other.start()
    try:
        assert held.wait(10)
        report = Dispatcher().tick()
        assert report.dispatched == 3
        assert sorted(EventOutbox.objects.values_list("id", flat=True)) == ids[:3]
    finally:
        released.set()
        other.join()
    assert Dispatcher().tick().dispatched == 3
    assert EventOutbox.objects.count() == 0


def test_a_failing_event_backs_off_then_dead_letters_after_eight_attempts() -> None:
    album = MediaItem.objects.create(kind="album", library="Music", title="lp")
    fine = MediaItem.objects.create(kind="track", library="Music", title="ok", parent=album)
    # test-tracks' condition divides by zero for a track of 1999: its seeding fails for real.
    poison = MediaItem.objects.create(
        kind="track", library="Music", title="bad", parent=album, year=1999
    )
    clock = FrozenClock(timezone.now())
    dispatcher = Dispatcher(clock)

    first = dispatcher.tick()

    assert first.failed == 1 and "division by zero" in first.errors[0]
    assert _row(fine, "test-tracks").status == "pending"  # the rest of the batch went through
    event = EventOutbox.objects.get()
    assert (event.kind, event.item_id, event.attempts) == ("item.created", poison.pk, 1)
    assert event.next_attempt_at > clock.now() + timedelta(seconds=14)
    assert dispatcher.tick().failed == 0  # not due yet: left alone

    for _ in range(7):
        clock.advance(timedelta(hours=2))
        dispatcher.tick()
    event.refresh_from_db()
    assert event.attempts == 8
    assert event.dead_at is not None
    assert "division by zero" in event.last_error
    clock.advance(timedelta(days=1))
    assert dispatcher.tick().failed == 0  # a dead letter waits for an operator

    MediaItem.objects.filter(pk=poison.pk).update(year=2001)
    EventOutbox.objects.exclude(pk=event.pk).delete()
    assert redeliver([event.pk]) == 1
    assert Dispatcher().tick().dispatched == 1
    assert _row(poison, "test-tracks").status == "pending"
