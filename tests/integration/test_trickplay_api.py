"""The trickplay HTTP handler (issue 41) over the demo's trickplay provider: an item's index
and tiles served from its folder and nowhere else, with caching headers; an item that can have
trickplay and has none is answered 404 `queued` with one run however often it is asked; one
that cannot is a plain 404. (A real worker making it, then served: `test_media_stages.py`.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from coverage.models import MediaFile, MediaFileItem, MediaItem
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from tests.support.messages import empty_queues
from tests.support.users import account

pytestmark = pytest.mark.django_db(transaction=True)

INDEX = "WEBVTT\n\n00:00:00.000 --> 00:00:02.000\nsprite.jpg#xywh=0,0,160,90\n"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, trickplay_root=tmp_path / "trickplay")
    yield tmp_path / "trickplay"
    settings.CONFIG = config
    empty_queues("task.t.trickplay")


@pytest.fixture
def player() -> Client:
    viewer = account("player", Access.VIEW)
    return Client(headers={"Authorization": f"Bearer {tokens.issue(viewer)[1]}"})


def _item(kind: str = "movie", streams: list[dict[str, object]] | None = None) -> int:
    item = MediaItem.objects.create(kind=kind, library="films", title="A film")
    file = MediaFile.objects.create(
        path=f"/media/{item.id}.mkv", size=1, streams=streams, duration_s=10.0
    )
    MediaFileItem.objects.create(file=file, item=item)
    return item.id


def test_an_items_index_and_tiles_are_served_from_its_folder_with_caching(
    root: Path, player: Client
) -> None:
    folder = root / "7"
    folder.mkdir(parents=True)
    (folder / "index.vtt").write_text(INDEX)
    (folder / "sprite.jpg").write_bytes(b"\xff\xd8\xff tiles")

    index = player.get("/api/v1/items/7/trickplay.vtt")
    assert index.status_code == 200 and index["Content-Type"].startswith("text/vtt")
    tag = player.get("/api/v1/items/7/trickplay/sprite.jpg")["ETag"].strip('"')
    assert f"\ntrickplay/sprite.jpg?v={tag}#xywh=0,0,160,90\n" in index.content.decode()
    assert index["Cache-Control"] == "private, max-age=60"
    again = player.get("/api/v1/items/7/trickplay.vtt", headers={"If-None-Match": index["ETag"]})
    assert again.status_code == 304

    tile = player.get("/api/v1/items/7/trickplay/sprite.jpg")
    assert tile.status_code == 200 and tile["Content-Type"] == "image/jpeg"
    assert b"".join(tile.streaming_content) == b"\xff\xd8\xff tiles"  # type: ignore[attr-defined]
    assert tile["Cache-Control"] == "private, max-age=86400" and tile["ETag"]


def test_nothing_outside_the_items_folder_is_served(root: Path, player: Client) -> None:
    folder = root / "7"
    folder.mkdir(parents=True)
    secret = root.parent / "secret.jpg"
    secret.write_bytes(b"not yours")
    (folder / "link.jpg").symlink_to(secret)
    (root / "8").mkdir()
    (root / "8" / "other.jpg").write_bytes(b"item 8's")
    for name in ("link.jpg", "index.vtt", "missing.jpg", "..jpg", ".hidden.jpg"):
        answer = player.get(f"/api/v1/items/7/trickplay/{name}")
        assert answer.status_code == 404, name
        assert answer.json()["detail"] == f"item 7 has no trickplay image {name!r}"
    for escape in ("..%2F8%2Fother.jpg", "../8/other.jpg", "%2E%2E%2F8%2Fother.jpg"):
        assert player.get(f"/api/v1/items/7/trickplay/{escape}").status_code == 404, escape
    # An item folder that is itself a link out of the trickplay folder.
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "index.vtt").write_text(INDEX)
    (outside / "sprite.jpg").write_bytes(b"not an item's")
    (root / "9").symlink_to(outside)
    assert player.get("/api/v1/items/9/trickplay/sprite.jpg").status_code == 404
    assert player.get("/api/v1/items/9/trickplay.vtt").status_code == 404
    assert player.get("/api/v1/items/x/trickplay.vtt").status_code == 422
    assert Client().get("/api/v1/items/7/trickplay.vtt").status_code == 401


def test_a_missing_index_is_queued_once_however_many_players_ask(
    root: Path, player: Client
) -> None:
    item_id = _item(streams=[{"type": "video", "width": 320, "height": 180}])

    answers = [player.get(f"/api/v1/items/{item_id}/trickplay.vtt") for _ in range(3)]

    assert {answer.status_code for answer in answers} == {404}
    bodies = [answer.json() for answer in answers]
    assert {body["code"] for body in bodies} == {"trickplay_queued"}
    (queued,) = {body["queued"] for body in bodies}
    run = TaskHistory.objects.get(id=queued)
    assert (run.task_id, run.priority, run.input) == (
        "trickplay",
        2,
        {"stage": "trickplay", "item_id": item_id},
    )
    assert run.trigger["idempotencyKey"] == f"coverage:trickplay:{item_id}"
    assert TaskHistory.objects.filter(task_id="trickplay").count() == 1


def test_an_item_that_cannot_have_trickplay_is_a_plain_404(root: Path, player: Client) -> None:
    audio = _item(streams=[{"type": "audio"}])
    unprobed = _item()
    for item_id in (audio, unprobed, 999_999):
        answer = player.get(f"/api/v1/items/{item_id}/trickplay.vtt")
        assert answer.status_code == 404
        assert answer.json() == {"detail": f"item {item_id} has no trickplay and cannot have one"}
    assert not TaskHistory.objects.filter(task_id="trickplay").exists()
