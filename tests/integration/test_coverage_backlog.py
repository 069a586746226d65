"""The coverage backlog over HTTP and in the admin: counts, drill-down, rescan, heal, dead
letters — with the view and operate permissions."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone

from coverage.models import EventOutbox, MediaItem, MediaItemStageState
from coverage.sweep import Sweep
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from tests.support.catalog import empty_queues, movie
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = "test-probe"


@pytest.fixture(autouse=True)
def _empty_queues() -> Iterator[None]:
    yield
    empty_queues()


def _client(*grants: Access) -> Client:
    user = account(f"user-{'-'.join(g.value for g in grants) or 'none'}", *grants)
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _ops() -> Client:
    client = Client()
    user = operator()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _stages(client: Client) -> dict[str, dict[str, object]]:
    response = client.get("/api/v1/coverage")
    assert response.status_code == 200, response.content
    return {stage["stage"]: stage for stage in response.json()}


def test_the_backlog_counts_each_status_and_the_oldest_waiting_row() -> None:
    movies = [movie(f"m{n}") for n in range(3)]
    movie("no file", file=False)
    Sweep().tick()
    MediaItemStageState.objects.filter(item=movies[0]).update(status="completed")
    MediaItemStageState.objects.filter(item=movies[1]).update(
        status="pending", next_eligible_at=timezone.now() - timedelta(hours=2)
    )

    stage = _stages(_client(Access.VIEW))[STAGE]

    counts = stage["counts"]
    assert isinstance(counts, dict)
    assert (counts["completed"], counts["pending"], counts["running"]) == (1, 1, 1)
    assert counts["skipped_permanent"] == 1
    assert stage["total"] == 4
    assert stage["task"] == "test-cover" and stage["driven"] is True
    age = stage["oldest_waiting_age_s"]
    assert isinstance(age, float) and 7100 < age < 7300
    assert isinstance(stage["last_tick"], dict) and stage["last_tick"]["started"] == 3


def test_the_rows_of_a_status_come_in_pages_with_their_items() -> None:
    for n in range(5):
        movie(f"gone {n}", file=False)
    Sweep().tick()
    client = _client(Access.VIEW)

    first = client.get(f"/api/v1/coverage/{STAGE}?status=skipped_permanent&limit=3").json()
    second = client.get(
        f"/api/v1/coverage/{STAGE}?status=skipped_permanent&limit=3&cursor={first['next_cursor']}"
    ).json()

    titles = [row["title"] for row in first["items"] + second["items"]]
    assert titles == [f"gone {n}" for n in range(5)]
    assert second["next_cursor"] is None
    assert {row["reason"] for row in first["items"]} == {"ineligible"}
    assert client.get(f"/api/v1/coverage/{STAGE}?status=lost").status_code == 422
    assert client.get("/api/v1/coverage/no-such-stage").status_code == 404


def test_a_rescan_starts_the_items_run_now_and_then_joins_it() -> None:
    item = movie("now please")
    client = _ops()

    started = client.post(f"/api/v1/coverage/{STAGE}/items/{item.pk}/rescan")
    again = client.post(f"/api/v1/coverage/{STAGE}/items/{item.pk}/rescan")

    assert started.status_code == 202, started.content
    run = TaskHistory.objects.get(id=started.json()["run_id"])
    assert run.priority == 2
    assert run.trigger["kind"] == "api" and run.trigger["actor"] == "ops"
    row = MediaItemStageState.objects.get(item=item, stage=STAGE)
    assert (row.status, row.run_id) == ("running", run.id)
    assert again.status_code == 200 and again.json()["run_id"] == run.id


def test_a_rescan_is_refused_clearly_for_an_item_the_stage_does_not_take() -> None:
    no_file = movie("no file", file=False)
    album = MediaItem.objects.create(kind="album", library="Music", title="lp")
    client = _ops()

    ineligible = client.post(f"/api/v1/coverage/{STAGE}/items/{no_file.pk}/rescan")
    wrong_kind = client.post(f"/api/v1/coverage/{STAGE}/items/{album.pk}/rescan")
    missing = client.post(f"/api/v1/coverage/{STAGE}/items/999999/rescan")
    unknown = client.post(f"/api/v1/coverage/nope/items/{no_file.pk}/rescan")

    assert ineligible.status_code == 409
    assert "not eligible" in ineligible.json()["detail"]
    assert MediaItemStageState.objects.get(item=no_file, stage=STAGE).reason == "ineligible"
    assert (
        wrong_kind.status_code == 409 and "applies to movie, episode" in wrong_kind.json()["detail"]
    )
    assert missing.status_code == 404 and "no item 999999" in missing.json()["detail"]
    assert unknown.status_code == 404
    assert not TaskHistory.objects.exists()


def test_rescan_and_heal_need_the_operate_permission() -> None:
    item = movie("guarded")
    viewer = _client(Access.VIEW)

    assert viewer.post(f"/api/v1/coverage/{STAGE}/items/{item.pk}/rescan").status_code == 403
    assert viewer.post(f"/api/v1/coverage/{STAGE}/heal").status_code == 403
    assert Client().get("/api/v1/coverage").status_code == 401
    assert not TaskHistory.objects.exists()


def test_heal_over_http_walks_every_skipped_row_now() -> None:
    items = [movie(f"h{n}") for n in range(4)]
    Sweep().tick()
    MediaItemStageState.objects.filter(item__in=items).update(
        status="skipped_permanent", reason="ineligible"
    )

    response = _ops().post(f"/api/v1/coverage/{STAGE}/heal")

    assert response.json() == {"stage": STAGE, "healed": 4}
    rows = MediaItemStageState.objects.filter(item__in=items, stage=STAGE)
    assert set(rows.values_list("status", flat=True)) == {"pending"}


def test_the_admin_backlog_page_shows_each_stage_and_heals_for_operators() -> None:
    movie("a")
    skipped = movie("b")
    Sweep().tick()
    MediaItemStageState.objects.filter(item=skipped).update(
        status="skipped_permanent", reason="ineligible"
    )
    viewer, ops = _client(Access.VIEW), _ops()

    page = viewer.get("/admin/coverage/mediaitemstagestate/backlog/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="stage-test-probe"' in html
    assert "status=skipped_permanent" in html
    assert 'value="Heal"' not in html  # a viewer sees no action
    assert (
        viewer.post("/admin/coverage/mediaitemstagestate/backlog/test-probe/heal/").status_code
        == 403
    )

    healed = ops.post("/admin/coverage/mediaitemstagestate/backlog/test-probe/heal/")

    assert healed.status_code == 302
    assert MediaItemStageState.objects.get(item=skipped, stage=STAGE).status == "pending"
    assert LogEntry.objects.filter(change_message="healed 1 rows of test-probe").exists()
    rows = viewer.get(f"/admin/coverage/mediaitemstagestate/?stage={STAGE}")
    assert rows.status_code == 200 and "Backlog" in rows.content.decode()


def test_the_admin_rescans_selected_rows_and_redelivers_dead_letters() -> None:
    item = movie("rescan me")
    row = MediaItemStageState.objects.create(item=item, stage=STAGE, status="completed")
    dead = EventOutbox.objects.create(
        kind="item.metadata_changed", item_id=item.pk, attempts=8, dead_at=timezone.now()
    )
    ops = _ops()

    ops.post(
        "/admin/coverage/mediaitemstagestate/",
        {"action": "rescan_items", "_selected_action": [row.pk]},
    )
    ops.post(
        "/admin/coverage/eventoutbox/",
        {"action": "redeliver_events", "_selected_action": [dead.pk]},
    )

    row.refresh_from_db()
    assert row.status == "running"
    assert TaskHistory.objects.get(id=row.run_id).trigger["kind"] == "admin"
    dead.refresh_from_db()
    assert (dead.dead_at, dead.attempts) == (None, 0)
    assert LogEntry.objects.filter(change_message__startswith="rescanned item").exists()


def test_a_rescan_while_the_batch_run_is_busy_puts_the_item_first_in_the_next_batch() -> None:
    for n in range(2):
        MediaItem.objects.create(kind="album", library="Music", title=f"lp {n}")
    Sweep().tick()  # one batch run for both albums
    late = MediaItem.objects.create(kind="album", library="Music", title="late")

    response = _ops().post(f"/api/v1/coverage/test-albums/items/{late.pk}/rescan")

    assert response.status_code == 409
    assert "goes first in the next one" in response.json()["detail"]
    row = MediaItemStageState.objects.get(item=late, stage="test-albums")
    assert row.status == "pending" and row.next_eligible_at.year == 1970
