"""The demo's media stages on real workers and real ffmpeg (issue 23): `load_demo_catalog
--files` writes short real videos and audio, some corrupt; `probe` stores what ffprobe finds,
which through the outbox makes `trickplay` due; trickplay writes a sprite and its WebVTT index;
a file ffmpeg cannot read fails permanent with ffmpeg's own words; a new probe resets
trickplay."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from coverage import sweep
from coverage.dispatcher import Dispatcher
from coverage.models import MediaFile, MediaItemStageState
from coverage.sweep import Sweep
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from tasks import registry
from tasks.definitions.catalog_media import INDEX, SPRITE
from tests.support.fixtures import wait_for, worker_process
from tests.support.users import account

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.needs("media"),
]

STAGES = ("probe", "trickplay")
# A seed whose catalog holds corrupt videos of both kinds (unreadable, damaged after a header).
ITEMS, SEED = 150, 4


@pytest.fixture(autouse=True)
def only_media_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep drives only these two stages: the demo's other io stages would start runs no
    worker here consumes, and their queued messages would push the io class past its depth
    threshold, so the sweep would skip `probe` for good."""
    media = [stage for stage in sweep.covered() if stage.id in STAGES]
    monkeypatch.setattr(sweep, "covered", lambda: media)


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    media, trickplay = tmp_path / "media", tmp_path / "trickplay"
    media.mkdir()
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, media_roots=(media,), trickplay_root=trickplay)
    yield media, trickplay
    settings.CONFIG = config


def _load(*extra: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "load_demo_catalog", "--items", str(ITEMS), "--seed", str(SEED), "--files", *extra,
        stdout=out, stderr=err,
    )  # fmt: skip
    return out.getvalue(), err.getvalue()


def _open(stage: str) -> int:
    return MediaItemStageState.objects.filter(
        stage=stage, status__in=["pending", "running"]
    ).count()


def _settle(stage: str) -> None:
    """Start the stage's due runs and wait until none is open (a tick starts a bounded batch)."""

    def settled() -> bool:
        Dispatcher().tick()
        Sweep().tick()
        return _open(stage) == 0

    wait_for(settled, timeout=120, interval=1.0)


def _error(row: MediaItemStageState) -> dict[str, str]:
    return TaskHistory.objects.get(id=row.run_id).error


def test_the_catalog_writes_real_media_and_some_corrupt(folders: tuple[Path, Path]) -> None:
    said, _ = _load()

    assert re.search(r"wrote short videos and audio with ffmpeg .*, [1-9]\d* of them corrupt", said)
    videos = MediaFile.objects.filter(is_missing=False, path__endswith=".mkv")
    assert videos.exists() and not videos.exclude(probed_at=None).exists()  # left for the probe
    probed = subprocess.run(
        ["ffprobe", "-v", "error", "-print_format", "json", "-show_streams", videos[0].path],
        capture_output=True,
        check=False,
    )
    if probed.returncode == 0:  # the first one may be a corrupt one
        types = {s["codec_type"] for s in json.loads(probed.stdout)["streams"]}
        assert types == {"video", "audio"}
    sizes = [Path(f.path).stat().st_size for f in videos]
    assert sizes == [f.size for f in videos] and max(sizes) < 1_000_000


def test_without_ffmpeg_the_catalog_says_so(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no ffmpeg on it

    said, complained = _load()

    assert "ffmpeg is not installed" in complained and "apt-get install ffmpeg" in complained
    assert "wrote short videos" not in said
    assert MediaFile.objects.filter(is_missing=False).exists()


def test_probe_then_trickplay_cover_the_catalog(folders: tuple[Path, Path]) -> None:
    media, trickplay = folders
    _load()
    queues = [
        queue_name(registry.get()[task], settings.CONFIG.per_task_queues)
        for task in ("media-probe", "trickplay")
    ]
    env = {"LUMASTRA_MEDIA_ROOTS": str(media), "LUMASTRA_TRICKPLAY_ROOT": str(trickplay)}
    # Before any probe, no video is known to be one: trickplay has nothing due.
    assert not MediaItemStageState.objects.filter(stage="trickplay", status="pending").exists()

    with worker_process(queues, concurrency=2, name="media", env=env):
        _settle("probe")
        _settle("trickplay")

        probes = MediaItemStageState.objects.filter(stage="probe")
        unreadable = probes.filter(status="failed_permanent")
        assert unreadable.exists() and probes.filter(status="completed").exists()
        for row in unreadable:
            assert "Invalid data found when processing input" in _error(row)["message"]
            assert _error(row)["kind"] == "permanent"
        probed = MediaFile.objects.exclude(probed_at=None).filter(path__endswith=".mkv")
        for file in probed:
            assert file.duration_s and 1.5 < file.duration_s < 11
            assert {s["type"] for s in file.streams} == {"video", "audio"}

        done = MediaItemStageState.objects.filter(stage="trickplay", status="completed")
        damaged = MediaItemStageState.objects.filter(stage="trickplay", status="failed_permanent")
        assert done.exists() and damaged.exists()
        for row in damaged:
            assert _error(row)["kind"] == "permanent"
            assert "ffmpeg exited with 1" in _error(row)["message"]
            assert not (trickplay / str(row.item_id)).exists()  # no empty folder left
        for row in done:
            folder = trickplay / str(row.item_id)
            assert (folder / SPRITE).read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG
            cues = (folder / INDEX).read_text().split("\n\n")
            result = TaskHistory.objects.get(id=row.run_id).result
            assert cues[0] == "WEBVTT" and len([c for c in cues[1:] if c]) == result["tiles"]
            assert TaskHistory.objects.get(id=row.run_id).cost_breakdown["cpu_seconds"] > 0
        assert not list(trickplay.glob("*/*.partial*"))

        # A new probe of a file: through the outbox, its item's trickplay is due again.
        again = done.first()
        assert again is not None
        MediaFile.objects.filter(links__item_id=again.item_id).update(probed_at=timezone.now())
        Dispatcher().tick()
        assert MediaItemStageState.objects.get(pk=again.pk).status == "pending"
        _settle("trickplay")
        assert MediaItemStageState.objects.get(pk=again.pk).status == "completed"


def test_a_player_asking_for_trickplay_has_it_made_once_then_served(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    media, trickplay = folders
    _load()
    # Only the probe is swept: trickplay is made because a player asks for it.
    probe_only = [stage for stage in sweep.covered() if stage.id == "probe"]
    monkeypatch.setattr(sweep, "covered", lambda: probe_only)
    queues = [
        queue_name(registry.get()[task], settings.CONFIG.per_task_queues)
        for task in ("media-probe", "trickplay")
    ]
    env = {"LUMASTRA_MEDIA_ROOTS": str(media), "LUMASTRA_TRICKPLAY_ROOT": str(trickplay)}
    player = Client(
        headers={"Authorization": f"Bearer {tokens.issue(account('player', Access.VIEW))[1]}"}
    )

    with worker_process(queues, concurrency=2, name="media", env=env):
        _settle("probe")
        videos = MediaItemStageState.objects.filter(stage="trickplay", status="pending")
        items = list(videos.values_list("item_id", flat=True)[:4])
        assert items
        asked = [
            {item: player.get(f"/api/v1/items/{item}/trickplay.vtt").json() for item in items}
            for _ in range(2)
        ]
        assert asked[0] == asked[1]  # asked twice, made once
        runs = {item: answer["queued"] for item, answer in asked[0].items()}
        wait_for(
            lambda: all(TaskHistory.objects.get(id=run).finished_at for run in runs.values()),
            timeout=120,
            interval=0.5,
        )

    made = [
        item for item, run in runs.items() if TaskHistory.objects.get(id=run).state == "completed"
    ]
    assert made
    for item in made:
        index = player.get(f"/api/v1/items/{item}/trickplay.vtt")
        assert index.status_code == 200
        assert re.search(r"\ntrickplay/sprite.jpg\?v=[0-9a-f-]+#xywh=0,0,", index.content.decode())
        tile = player.get(f"/api/v1/items/{item}/trickplay/{SPRITE}")
        assert b"".join(tile.streaming_content)[:3] == b"\xff\xd8\xff"  # type: ignore[attr-defined]
