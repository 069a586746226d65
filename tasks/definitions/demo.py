"""The demo pack `make run` starts: real work in three resource classes."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from pydantic import BaseModel, Field

from tasks import (
    MediaPath,
    NoInput,
    PermanentError,
    ScheduleRow,
    TaskContext,
    Timeout,
    define_task,
    dynamic,
    every,
    open_folder,
)

# Bounds of one hash-folder walk besides its input's max_files: how deep it descends and how
# many directory entries it looks at, so a tree of empty folders or links cannot keep it busy.
HASH_FOLDER_MAX_DEPTH = 32
HASH_FOLDER_MAX_ENTRIES = 100_000


class HashFolderInput(BaseModel, extra="forbid"):
    path: MediaPath = Field(
        description="folder below a media root (LUMASTRA_MEDIA_ROOTS) whose files are hashed"
    )
    max_files: int = Field(default=1_000, ge=1, le=10_000)


def hash_folder(ctx: TaskContext, params: HashFolderInput) -> dict[str, object]:
    with open_folder(params.path) as folder:
        files = list(
            folder.walk(
                limit=params.max_files,
                max_depth=HASH_FOLDER_MAX_DEPTH,
                max_entries=HASH_FOLDER_MAX_ENTRIES,
            )
        )
        digests: dict[str, str] = {}
        for index, relative in enumerate(files, start=1):
            ctx.raise_if_cancelled()
            digest = hashlib.sha256()
            with folder.open(relative) as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            digests[str(relative)] = digest.hexdigest()
            ctx.report_progress(index, len(files))
        stats = folder.stats
    ctx.log(
        f"hashed {len(digests)} files under {params.path}; looked at {stats.visited} entries, "
        f"skipped {stats.skipped_links} links and {stats.too_deep} folders too deep"
        + ("; stopped at a limit" if stats.truncated else "")
    )
    return {
        "files": len(digests),
        "sha256": digests,
        "skipped_links": stats.skipped_links,
        "too_deep": stats.too_deep,
        "truncated": stats.truncated,
    }


hash_folder_task = define_task(
    id="hash-folder",
    resource_class="cpu",
    execute=hash_folder,
    input_model=HashFolderInput,
    identity_for=lambda params: str(params.path),
    # 2: confined to the media roots; a worker still on 1 must not take a run started now.
    processing_version=2,
    description="SHA-256 of every file under a folder",
)


class SlowProgressInput(BaseModel, extra="forbid"):
    # A demo's bounds: at most 100 steps of 5 s, so no start can hold a worker for long.
    steps: int = Field(default=10, ge=1, le=100)
    step_seconds: float = Field(default=0.5, ge=0, le=5)


def slow_progress(ctx: TaskContext, params: SlowProgressInput) -> dict[str, int]:
    for step in range(1, params.steps + 1):
        ctx.sleep(params.step_seconds)
        ctx.report_progress(step, params.steps, note=f"step {step}")
        ctx.log(f"step {step} of {params.steps}")
    return {"steps": params.steps}


slow_progress_task = define_task(
    id="slow-progress",
    resource_class="io",
    execute=slow_progress,
    input_model=SlowProgressInput,
    timeout=Timeout(soft=timedelta(minutes=10), hard=timedelta(minutes=11)),
    description="sleeps in steps and reports progress after each",
)


def history_retention(ctx: TaskContext, params: NoInput) -> dict[str, int]:
    from orchestrator.models import TaskHistory
    from orchestrator.states import TERMINAL_RUN_STATES

    cutoff = timezone.now() - timedelta(days=settings.CONFIG.history_retention_days)
    deleted, _ = TaskHistory.objects.filter(
        state__in=[s.value for s in TERMINAL_RUN_STATES], finished_at__lt=cutoff
    ).delete()
    ctx.log(f"deleted {deleted} terminal runs finished before {cutoff.isoformat()}")
    return {"deleted": deleted}


history_retention_task = define_task(
    id="history-retention",
    resource_class="maintenance",
    execute=history_retention,
    schedule=every("1d", env_override="LUMASTRA_HISTORY_RETENTION_EVERY"),
    description="deletes terminal runs older than LUMASTRA_HISTORY_RETENTION_DAYS",
)


class EpgRefreshInput(BaseModel, extra="forbid"):
    source: str = Field(min_length=1, max_length=80, description="the EPG source's slug")
    url: str = Field(pattern=r"^https?://", max_length=500, description="the feed to fetch")


def epg_sources() -> list[ScheduleRow]:
    """The dynamic schedule of `epg-refresh`: one row per enabled EPG source (admin-editable),
    each on its own interval. One query per scheduler tick."""
    from coverage.models import EpgSource

    return [
        ScheduleRow(
            key=source.slug,
            input={"source": source.slug, "url": source.url},
            interval=timedelta(minutes=source.interval_minutes),
        )
        for source in EpgSource.objects.filter(enabled=True).only("slug", "url", "interval_minutes")
    ]


def epg_refresh(ctx: TaskContext, params: EpgRefreshInput) -> dict[str, str]:
    # The demo does not fetch the feed (no network in the demo); it records the refresh.
    from coverage.models import EpgSource

    refreshed = timezone.now()
    found = EpgSource.objects.filter(slug=params.source).update(last_refreshed_at=refreshed)
    if not found:
        raise PermanentError(f"EPG source {params.source!r} no longer exists")
    ctx.log(f"refreshed EPG source {params.source} from {params.url}")
    return {"source": params.source, "refreshed_at": refreshed.isoformat()}


epg_refresh_task = define_task(
    id="epg-refresh",
    resource_class="io",
    execute=epg_refresh,
    input_model=EpgRefreshInput,
    identity_for=lambda params: params.source,
    schedule=dynamic(epg_sources),
    description="refreshes one EPG source; each enabled source on its own interval",
)
