"""The media catalog stand-in: its shape rules, the demo loader and the admin pages."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.db.models import Model

from coverage.models import (
    PARENT_KIND,
    ExternalId,
    ItemKind,
    MediaFile,
    MediaFileItem,
    MediaItem,
)

pytestmark = pytest.mark.django_db


def _load(items: int, seed: int, *extra: str) -> str:
    out = io.StringIO()
    call_command(
        "load_demo_catalog", "--items", str(items), "--seed", str(seed), *extra, stdout=out
    )
    return out.getvalue()


def test_the_demo_catalog_has_every_kind_in_a_realistic_mix() -> None:
    said = _load(800, 3)

    total = MediaItem.objects.count()
    assert 760 <= total <= 800, total
    assert f"loaded {total} items" in said
    by_kind = {kind: MediaItem.objects.filter(kind=kind).count() for kind in ItemKind}
    assert all(by_kind.values()), by_kind
    assert by_kind[ItemKind.EPISODE] > by_kind[ItemKind.SEASON] > 0
    assert by_kind[ItemKind.TRACK] > by_kind[ItemKind.ALBUM]
    for child, parent in PARENT_KIND.items():
        assert not MediaItem.objects.filter(kind=child).exclude(parent__kind=parent).exists()
    leaves = MediaItem.objects.filter(kind__in=[ItemKind.MOVIE, ItemKind.EPISODE, ItemKind.TRACK])
    without_file = leaves.filter(file_links__isnull=True).count()
    assert 0 < without_file < leaves.count() * 0.2
    assert not MediaItem.objects.filter(kind=ItemKind.SERIES, file_links__isnull=False).exists()
    assert 0 < MediaFile.objects.filter(is_missing=True).count() < MediaFile.objects.count() * 0.1
    assert MediaFile.objects.exclude(probed_at=None).exclude(content_hash="").exists()
    assert MediaFileItem.objects.count() == MediaFile.objects.count()
    assert set(ExternalId.objects.values_list("provider", flat=True)) == {
        "tmdb",
        "imdb",
        "tvdb",
        "musicbrainz",
    }
    with connection.cursor() as cursor:  # the loader ran ANALYZE
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = 'media_items'")
        assert cursor.fetchone()[0] == total


# Committed loads: --replace TRUNCATEs, which Postgres refuses inside the transaction that
# inserted the rows (their foreign-key checks are still pending).
@pytest.mark.django_db(transaction=True)
def test_the_same_seed_gives_the_same_catalog_and_a_full_one_is_not_loaded_over() -> None:
    _load(300, 11)
    first = list(MediaItem.objects.order_by("id").values_list("kind", "title", "year"))

    with pytest.raises(CommandError, match=r"already has \d+ items; pass --replace"):
        _load(300, 11)
    _load(300, 11, "--replace")

    assert list(MediaItem.objects.order_by("id").values_list("kind", "title", "year")) == first
    _load(300, 12, "--replace")
    assert list(MediaItem.objects.order_by("id").values_list("kind", "title", "year")) != first


@pytest.mark.parametrize(
    ("kind", "with_parent"),
    [(ItemKind.EPISODE, False), (ItemKind.TRACK, False), (ItemKind.MOVIE, True)],
)
def test_only_seasons_episodes_and_tracks_have_a_parent(kind: str, with_parent: bool) -> None:
    album = MediaItem.objects.create(kind=ItemKind.ALBUM, library="Music", title="A")
    with pytest.raises(IntegrityError, match="media_items_parent_by_kind"), transaction.atomic():
        MediaItem.objects.create(
            kind=kind, library="x", title="t", parent=album if with_parent else None
        )


@pytest.mark.parametrize("model", [MediaItem, MediaFile, MediaFileItem, ExternalId])
def test_each_catalog_table_has_an_admin_page(admin_client: Any, model: type[Model]) -> None:
    _load(100, 1)
    name = model._meta.model_name
    first = model.objects.order_by("pk").first()
    assert first is not None

    assert admin_client.get(f"/admin/coverage/{name}/").status_code == 200
    assert admin_client.get(f"/admin/coverage/{name}/{first.pk}/change/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_bulk_load_seeds_every_covered_stage_without_outbox_events() -> None:
    from coverage.models import EventOutbox, MediaItemStageState

    said = _load(300, 5)

    movies_and_episodes = MediaItem.objects.filter(kind__in=["movie", "episode"]).count()
    assert MediaItemStageState.objects.filter(stage="test-probe").count() == movies_and_episodes
    assert "coverage rows" in said
    assert not EventOutbox.objects.exists()
    # Eligibility decided as the rows were made: a movie without a present file is skipped.
    skipped = MediaItemStageState.objects.filter(stage="test-probe", status="skipped_permanent")
    assert skipped.exists()
    assert not skipped.filter(item__file_links__file__is_missing=False).exists()


@pytest.mark.django_db(transaction=True)
def test_coverage_seed_fills_a_stage_whose_rows_are_missing() -> None:
    from coverage.models import MediaItemStageState

    _load(200, 6)
    MediaItemStageState.objects.filter(stage="test-probe").delete()
    out = io.StringIO()

    call_command("coverage_seed", stdout=out)

    made = MediaItemStageState.objects.filter(stage="test-probe").count()
    assert made == MediaItem.objects.filter(kind__in=["movie", "episode"]).count()
    assert f"test-probe: {made} rows made" in out.getvalue()
