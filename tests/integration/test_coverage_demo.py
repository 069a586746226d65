"""The demo pack on real workers: a small catalog with real files fills its three covered
stages (what `make run` shows)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db.models import Count

from coverage.models import MediaFile, MediaItem, MediaItemStageState
from coverage.sweep import Sweep
from orchestrator.routing import queue_name
from tasks import registry
from tests.support.fixtures import wait_for, worker_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TASKS = ("catalog-checksum", "catalog-artwork", "catalog-season-summary")
STAGES = ("checksum", "artwork", "season-summary")


@pytest.fixture
def media_root(tmp_path: Path) -> Iterator[Path]:
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, media_roots=(tmp_path,))
    yield tmp_path
    settings.CONFIG = config


def _open_rows() -> int:
    return MediaItemStageState.objects.filter(
        stage__in=STAGES, status__in=["pending", "running"]
    ).count()


def test_the_demo_stages_cover_a_small_catalog(media_root: Path) -> None:
    out = io.StringIO()
    call_command("load_demo_catalog", "--items", "60", "--seed", "2", "--files", stdout=out)
    per_task = settings.CONFIG.per_task_queues
    queues = [queue_name(registry.get()[task], per_task) for task in TASKS]
    env = {"LUMASTRA_MEDIA_ROOTS": str(media_root)}

    with worker_process(queues, concurrency=2, name="demo-pack", env=env):
        Sweep().tick()
        wait_for(lambda: _open_rows() == 0, timeout=60)

    by_status = dict(
        MediaItemStageState.objects.filter(stage__in=STAGES)
        .values_list("stage")
        .annotate(n=Count("id"))
        .values_list("stage", "n")
    )
    assert set(by_status) == set(STAGES), by_status
    failed = MediaItemStageState.objects.filter(stage__in=STAGES, status__startswith="failed")
    assert not failed.exclude(status="failed_transient").exists(), list(failed.values())
    checksums = MediaItemStageState.objects.filter(stage="checksum", status="completed")
    assert checksums.exists()
    for row in checksums.select_related("item")[:5]:
        from orchestrator.models import TaskHistory

        result = TaskHistory.objects.get(id=row.run_id).result
        path = Path(result["path"])
        assert path.is_relative_to(media_root)
        assert result["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # A file the catalog says is missing is not on disk, and its item was never started.
    missing = MediaFile.objects.filter(is_missing=True).values_list("path", flat=True)
    assert all(not Path(path).exists() for path in missing)
    seasons = MediaItem.objects.filter(kind="season").count()
    summaries = MediaItemStageState.objects.filter(stage="season-summary", status="completed")
    assert summaries.count() == seasons > 0
