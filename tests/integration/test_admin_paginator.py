"""The admin's estimated-count paginator (orchestrator/admin/paginator.py): exact counts up to
its cap, Postgres's estimate past it, and the big lists that use it; and the catalog's filters
whose choices come from the registry or an index walk instead of a DISTINCT over every row."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client

from coverage.models import ExternalId, MediaItem, MediaItemStageState
from coverage.stages import covered
from orchestrator.admin.paginator import EstimatedCountPaginator
from tests.support.users import account

pytestmark = pytest.mark.django_db


class _SmallCap(EstimatedCountPaginator):
    exact_up_to = 5


def _items(count: int, kind: str = "movie") -> None:
    MediaItem.objects.bulk_create(
        MediaItem(kind=kind, library="Movies", title=f"t{n}") for n in range(count)
    )


def test_a_short_list_gets_its_exact_count() -> None:
    _items(4)
    _items(3, kind="album")
    paginator = _SmallCap(MediaItem.objects.filter(kind="album").order_by("-id"), 2)
    assert paginator.count == 3
    assert not paginator.estimated
    assert paginator.num_pages == 2


def test_a_long_list_gets_the_planners_estimate_never_below_the_cap() -> None:
    _items(40)
    _items(10, kind="album")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE media_items")  # sees this transaction's rows
    paginator = _SmallCap(MediaItem.objects.order_by("-id"), 10)
    # The estimate of a whole table is its row count from the statistics just taken.
    assert paginator.count == 50
    assert paginator.estimated
    assert len(paginator.page(1).object_list) == 10

    # A filter the statistics say little about (a title): the estimate, at least the cap + 1.
    guessed = _SmallCap(MediaItem.objects.filter(title__startswith="t1").order_by("id"), 10)
    assert guessed.count >= 6
    assert guessed.estimated


def test_a_page_past_the_estimate_is_refused_like_any_page_past_the_end() -> None:
    from django.core.paginator import EmptyPage

    _items(12)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE media_items")
    paginator = _SmallCap(MediaItem.objects.order_by("id"), 5)
    assert paginator.num_pages == 3
    with pytest.raises(EmptyPage):
        paginator.page(4)


def test_a_list_that_is_not_a_queryset_is_counted_as_it_is() -> None:
    paginator = _SmallCap(list(range(8)), 3)
    assert paginator.count == 8
    assert not paginator.estimated


@pytest.mark.parametrize(
    "url",
    [
        "/admin/coverage/mediaitemstagestate/",
        "/admin/coverage/mediaitem/",
        "/admin/coverage/mediafile/",
        "/admin/coverage/mediafileitem/",
        "/admin/coverage/externalid/",
        "/admin/coverage/eventoutbox/",
    ],
)
def test_the_big_lists_count_with_it(url: str) -> None:
    _items(3)
    client = Client()
    client.force_login(account("boss", superuser=True))
    response = client.get(url)
    assert response.status_code == 200
    changelist: Any = response.context["cl"]
    assert isinstance(changelist.paginator, EstimatedCountPaginator)
    if url == "/admin/coverage/mediaitem/":
        assert changelist.result_count == 3


def _admin() -> Client:
    client = Client()
    client.force_login(account("boss", superuser=True))
    return client


def _choices(response: Any, title: str) -> list[str]:
    (spec,) = [s for s in response.context["cl"].filter_specs if s.title == title]
    return [str(value) for value, _ in spec.lookup_choices]


def test_the_library_filter_lists_each_library_once_and_filters_by_it() -> None:
    for library in ("Movies", "Kids", "Movies", "Music"):
        MediaItem.objects.create(kind="movie", library=library, title=library)
    client = _admin()
    response = client.get("/admin/coverage/mediaitem/")
    assert _choices(response, "library") == ["Kids", "Movies", "Music"]
    filtered = client.get("/admin/coverage/mediaitem/?library=Movies")
    assert filtered.context["cl"].result_count == 2


def test_the_provider_filter_lists_each_provider_once_and_filters_by_it() -> None:
    items = [
        MediaItem.objects.create(kind="movie", library="Movies", title=f"m{n}") for n in range(3)
    ]
    for item, provider in zip(items, ("tmdb", "imdb", "tmdb"), strict=True):
        ExternalId.objects.create(item=item, provider=provider, value=str(item.pk))
    client = _admin()
    response = client.get("/admin/coverage/externalid/")
    assert _choices(response, "provider") == ["imdb", "tmdb"]
    assert client.get("/admin/coverage/externalid/?provider=tmdb").context["cl"].result_count == 2


def test_the_stage_filter_lists_the_covered_stages_and_the_backlog_drill_down_filters() -> None:
    item = MediaItem.objects.create(kind="movie", library="Movies", title="m")
    stages = sorted(c.id for c in covered())
    MediaItemStageState.objects.filter(item=item).delete()
    MediaItemStageState.objects.create(item=item, stage=stages[0], status="failed_permanent")
    MediaItemStageState.objects.create(item=item, stage=stages[-1], status="pending")
    client = _admin()
    url = "/admin/coverage/mediaitemstagestate/"
    assert _choices(client.get(url), "stage") == stages
    # The backlog page's links: ?stage=…&status=…
    drill = client.get(f"{url}?stage={stages[0]}&status=failed_permanent")
    assert [row.item_id for row in drill.context["cl"].result_list] == [item.pk]
