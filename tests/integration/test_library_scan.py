"""The library scan (`coverage.library`, issue 41) on real files and the real catalog: new media
files become items, files and links; a rewritten file, a deleted one and one that came back
become the catalog's events; nothing outside the media files or the roots is read; an
operator's rescan starts one run per folder."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from coverage import library
from coverage.models import EventOutbox, MediaFile, MediaItem
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from tests.support.messages import empty_queues
from tests.support.users import account, operator

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    media = (tmp_path / "films").resolve()
    media.mkdir()
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, media_roots=(media,))
    yield media
    settings.CONFIG = config
    empty_queues("task.t.catalog-rescan")


def _events(kind: str) -> list[int]:
    return sorted(EventOutbox.objects.filter(kind=kind).values_list("item_id", flat=True))


def test_new_rewritten_deleted_and_returning_files_become_catalog_changes(root: Path) -> None:
    for n in range(50):
        (root / f"Film {n:02d} (19{n + 50}).mkv").write_bytes(b"v" * (n + 1))
    (root / "notes.txt").write_text("not media")
    (root / ".partial.mkv").write_bytes(b"a download in progress")

    first = library.sync(root, root)

    assert (first.added, first.changes) == (50, 50)
    film = MediaFile.objects.get(path=str(root / "Film 07 (1957).mkv"))
    item = MediaItem.objects.get(file_links__file=film)
    assert (item.kind, item.title, item.year, item.library) == ("movie", "Film 07", 1957, "films")
    assert film.size == 8 and film.mtime is not None
    assert len(_events("file.linked")) == 50
    assert library.sync(root, root).changes == 0  # nothing changed: nothing written

    path = root / "Film 07 (1957).mkv"
    path.write_bytes(b"rewritten, longer")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    (root / "Film 08 (1958).mkv").unlink()
    assert library.sync(root, root) == library.Synced(modified=1, missing=1)
    assert _events("file.modified") == [item.id]
    gone = MediaFile.objects.get(path=str(root / "Film 08 (1958).mkv"))
    assert gone.is_missing
    assert len(_events("file.presence_changed")) == 1

    (root / "Film 08 (1958).mkv").write_bytes(b"back")
    assert library.sync(root, root) == library.Synced(back=1)
    assert not MediaFile.objects.get(pk=gone.pk).is_missing


def test_a_folder_is_synced_alone_and_audio_becomes_tracks_of_its_album(root: Path) -> None:
    album = root / "Blue Train"
    album.mkdir()
    (album / "01 - Blue Train.flac").write_bytes(b"a")
    (album / "02 - Moment's Notice.flac").write_bytes(b"b")
    (root / "Elsewhere.mkv").write_bytes(b"not in the folder")
    outside = root.parent / "outside.mkv"
    outside.write_bytes(b"not in a root")
    (album / "03 - Linked.flac").symlink_to(outside)

    synced = library.sync(root, album)

    assert synced.added == 2
    tracks = MediaItem.objects.filter(kind="track").order_by("index_number")
    assert [(t.title, t.index_number, t.parent.title) for t in tracks] == [  # type: ignore[union-attr]
        ("Blue Train", 1, "Blue Train"),
        ("Moment's Notice", 2, "Blue Train"),
    ]
    assert not MediaFile.objects.filter(path__endswith="Elsewhere.mkv").exists()

    # A folder moved away: everything below it is missing.
    album.rename(root.parent / "moved")
    assert library.sync(root, album).missing == 2


def test_an_operators_rescan_is_one_run_per_folder_and_stays_inside_the_roots(
    root: Path,
) -> None:
    api = Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})
    (root / "sub").mkdir()

    first = api.post("/api/v1/catalog/rescan", {"path": str(root / "sub")}, "application/json")
    again = api.post("/api/v1/catalog/rescan", {"path": f"{root}/sub/"}, "application/json")

    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["run_id"] == again.json()["run_id"]
    run = TaskHistory.objects.get(id=first.json()["run_id"])
    assert (run.task_id, run.priority, run.input) == (
        "catalog-rescan",
        2,
        {"path": str(root / "sub")},
    )
    for outside in (str(root.parent), f"{root}/../", "/etc", str(root / "missing")):
        refused = api.post("/api/v1/catalog/rescan", {"path": outside}, "application/json")
        assert refused.status_code == 422, outside
        assert refused.json()["errors"][0]["loc"] == ["body", "body", "path"]


def test_the_backlog_pages_rescan_needs_operate_and_starts_the_folders_run(root: Path) -> None:
    page, rescan = reverse("admin:coverage_backlog"), reverse("admin:coverage_rescan")
    viewer = Client()
    viewer.force_login(account("viewer", Access.VIEW))
    assert b'id="rescan"' not in viewer.get(page).content
    assert viewer.post(rescan, {"path": str(root)}).status_code == 403
    ops = Client()
    ops.force_login(operator("ops"))
    assert b'id="rescan"' in ops.get(page).content

    answered = ops.post(rescan, {"path": str(root)}, follow=True)

    (run,) = TaskHistory.objects.filter(task_id="catalog-rescan")
    assert run.input == {"path": str(root)} and run.trigger["actor"] == "ops"
    assert f"rescan run {run.id} queued" in answered.content.decode()
    refused = ops.post(rescan, {"path": "/etc"}, follow=True)
    assert "Not rescanned" in refused.content.decode()
    assert TaskHistory.objects.filter(task_id="catalog-rescan").count() == 1


def test_what_the_catalog_cannot_hold_or_must_not_touch_is_left_alone(root: Path) -> None:
    (root / "Good (2001).mkv").write_bytes(b"g")
    os.close(os.open(bytes(root) + b"/Bad \xff name.mkv", os.O_CREAT | os.O_WRONLY))
    deep = root.joinpath(*(letter * 200 for letter in "defgh"))  # a path past 1,000 characters
    deep.mkdir(parents=True)
    (deep / "Long (2001).mkv").write_bytes(b"l")
    trash = root / ".Trash-1000"
    trash.mkdir()
    (trash / "Deleted (1999).mkv").write_bytes(b"d")
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    (root / "linked").symlink_to(elsewhere)

    synced = library.sync(root, root)

    assert (synced.added, synced.unstorable) == (1, 2)
    assert not MediaFile.objects.filter(path__contains=".Trash").exists()
    for refused in (trash, root / "linked", root.parent):
        with pytest.raises(library.NotSynced):
            library.sync(root, refused)


def test_a_root_that_looks_unmounted_is_not_emptied_and_old_rows_learn_their_mtime(
    root: Path,
) -> None:
    (root / "Kept (2001).mkv").write_bytes(b"k")
    library.sync(root, root)
    # A row as the demo loader writes it, before the scan kept mtimes: its first scan is
    # not a rewrite.
    MediaFile.objects.update(mtime=None)
    EventOutbox.objects.all().delete()
    assert library.sync(root, root) == library.Synced()
    assert MediaFile.objects.get().mtime is not None
    assert not EventOutbox.objects.exists()

    (root / "Kept (2001).mkv").unlink()  # the root is empty: the mount, not the files, is gone
    with pytest.raises(library.NotSynced, match="is it mounted"):
        library.sync(root, root)
    assert not MediaFile.objects.get().is_missing
