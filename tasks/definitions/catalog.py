"""The demo's covered stages: per-item work on the demo catalog (`load_demo_catalog --files`),
started by the stage-sweep so `make run` shows coverage filling up.

- `checksum` (io): the SHA-256 of each movie's, episode's and track's present file, read
  below the media roots like any task input;
- `artwork` (discovery): a poster for each movie and episode with an id at a metadata
  provider, asked of the `metadata` provider (`define_provider`: cached, under its circuit
  and the `metadata-api` limit), whose fetch is a stand-in for the remote metadata API (the
  one fake: the demo has no network);
- `season-summary` (analysis): per season, once its episodes have settled, how many episodes
  it has, how many with a file, and their size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, Field

from tasks import (
    CoverageItem,
    CoveredStage,
    PermanentError,
    TaskContext,
    define_limit,
    define_provider,
    define_task,
    open_folder,
    providers,
    skipped,
)

# An item a file on disk holds (the catalog knows of no missing one among its files).
HAS_PRESENT_FILE = (
    "EXISTS (SELECT 1 FROM media_file_items fi JOIN media_files f ON f.id = fi.file_id"
    " WHERE fi.item_id = mi.id AND NOT f.is_missing)"
)
_HAS_EXTERNAL_ID = "EXISTS (SELECT 1 FROM external_ids x WHERE x.item_id = mi.id)"


def _checksum(ctx: TaskContext, params: CoverageItem) -> dict[str, Any]:
    from coverage.models import MediaFile

    files = MediaFile.objects.filter(links__item_id=params.item_id, is_missing=False)
    found = files.values_list("path", flat=True).first()
    if found is None:
        return skipped("no-file")
    path = Path(found)
    digest = hashlib.sha256()
    with open_folder(path.parent) as folder, folder.open(PurePosixPath(path.name)) as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    ctx.count("bytes", path.stat().st_size)
    return {"path": found, "sha256": digest.hexdigest()}


checksum_task = define_task(
    id="catalog-checksum",
    resource_class="io",
    execute=_checksum,
    input_model=CoverageItem,
    description="SHA-256 of an item's file (covered stage `checksum`)",
    covers_stages=[
        CoveredStage(
            id="checksum",
            applies_to=("movie", "episode", "track"),
            eligible_sql=HAS_PRESENT_FILE,
            recover_when_additional_reasons=("no-file",),
            invalidated_by=(
                "file.linked",
                "file.unlinked",
                "file.modified",
                "file.content_changed",
                "file.presence_changed",
            ),
        )
    ],
)


def _poster(query: dict[str, Any]) -> dict[str, str | None]:
    """The stand-in for a remote metadata API: a poster URL for most ids, none for some, a slow
    answer now and then, and one call in a hundred failing as a 503 would."""
    provider, value = str(query["provider"]), str(query["id"])
    digest = hashlib.sha256(f"{provider}:{value}".encode()).digest()
    if random.random() < 0.01:  # a stand-in's weather, not a secret
        raise ConnectionError(f"{provider} answered 503 for {value}")
    time.sleep(digest[2] / 2550)  # up to 0.1 s, like a network round trip
    if digest[0] < 20:
        return {"poster": None}
    return {"poster": f"https://images.example.invalid/{provider}/{value}.jpg"}


# The metadata API's budget, shared by every caller of its provider.
metadata_api = define_limit("metadata-api", rate="100/s")
metadata = define_provider(
    "metadata", fetch=_poster, timeout_s=5, limits=("metadata-api",), cache_s=86_400
)


def _artwork(ctx: TaskContext, params: CoverageItem) -> dict[str, Any]:
    from coverage.models import ExternalId

    ids = list(ExternalId.objects.filter(item_id=params.item_id).values_list("provider", "value"))
    if not ids:
        return skipped("no-external-id")
    for provider, value in sorted(ids):
        poster = providers.call("metadata", {"provider": provider, "id": value})["poster"]
        if poster is not None:
            return {"provider": provider, "poster": poster}
    return skipped("no-artwork")


artwork_task = define_task(
    id="catalog-artwork",
    resource_class="discovery",
    execute=_artwork,
    input_model=CoverageItem,
    description="matches a poster at the item's metadata providers (covered stage `artwork`)",
    covers_stages=[
        CoveredStage(
            id="artwork",
            applies_to=("movie", "episode"),
            eligible_sql=_HAS_EXTERNAL_ID,
            recover_when_additional_reasons=("no-external-id",),
            invalidated_by=("external_id.changed", "item.metadata_changed"),
        )
    ],
)


class RescanInput(BaseModel, extra="forbid"):
    path: str = Field(description="a folder inside a media root, or a root")


def _rescan(ctx: TaskContext, params: RescanInput) -> dict[str, Any]:
    from django.conf import settings

    from coverage import library

    root = library.within(settings.CONFIG.media_roots, Path(params.path))
    if root is None:
        raise PermanentError(f"{params.path!r} is not a folder inside a media root")
    synced = library.sync(root, Path(params.path).resolve())
    ctx.log(
        f"{params.path}: {synced.added} added, {synced.modified} modified, "
        f"{synced.missing} missing, {synced.back} back"
    )
    return dataclasses.asdict(synced)


rescan_task = define_task(
    id="catalog-rescan",
    resource_class="io",
    execute=_rescan,
    input_model=RescanInput,
    description="brings the catalog's files below a folder in step with the disk "
    "(an operator's rescan now; the file watcher does it as files change)",
)


def _season_summary(ctx: TaskContext, params: CoverageItem) -> dict[str, Any]:
    from django.db.models import Count, Q, Sum

    from coverage.models import MediaItem

    season = MediaItem.objects.filter(id=params.item_id, kind="season").first()
    if season is None:
        raise PermanentError(f"item {params.item_id} is not a season")
    episodes = MediaItem.objects.filter(parent=season)
    summary = episodes.aggregate(
        episodes=Count("id", distinct=True),
        with_file=Count("id", filter=Q(file_links__file__is_missing=False), distinct=True),
        bytes=Sum("file_links__file__size", filter=Q(file_links__file__is_missing=False)),
    )
    if not summary["episodes"]:
        return skipped("no-episodes")
    return {"season": season.title, **summary, "bytes": summary["bytes"] or 0}


season_summary_task = define_task(
    id="catalog-season-summary",
    resource_class="analysis",
    execute=_season_summary,
    input_model=CoverageItem,
    description="sums up a season once its episodes settle (covered stage `season-summary`)",
    covers_stages=[
        CoveredStage(
            id="season-summary",
            applies_to=("season",),
            invalidated_by=("children.changed",),
        )
    ],
)
