"""The demo pack `make run` starts: real work in two resource classes (io and cpu)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import Literal

from django.utils import timezone
from pydantic import BaseModel, Field

from tasks import (
    MediaFolder,
    MediaPath,
    PermanentError,
    ScheduleRow,
    Stage,
    TaskContext,
    Timeout,
    define_task,
    dynamic,
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


def _files(folder: MediaFolder, max_files: int) -> list[PurePosixPath]:
    return list(
        folder.walk(
            limit=max_files, max_depth=HASH_FOLDER_MAX_DEPTH, max_entries=HASH_FOLDER_MAX_ENTRIES
        )
    )


def _sha256(folder: MediaFolder, relative: PurePosixPath) -> str:
    digest = hashlib.sha256()
    with folder.open(relative) as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_folder(ctx: TaskContext, params: HashFolderInput) -> dict[str, object]:
    with open_folder(params.path) as folder:
        files = _files(folder, params.max_files)
        digests: dict[str, str] = {}
        for index, relative in enumerate(files, start=1):
            ctx.raise_if_cancelled()
            digests[str(relative)] = _sha256(folder, relative)
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
        ctx.report_progress(step, params.steps, item=f"step {step}")
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


# --- demo-pipeline: probe → checksum (cpu) and index (io); checksum → summary ---------------

DEMO_PIPELINE_STAGES = ("probe", "checksum", "index", "summary")


class DemoPipelineInput(BaseModel, extra="forbid"):
    path: MediaPath = Field(description="folder below a media root whose files are processed")
    fail_stage: Literal["probe", "checksum", "index", "summary"] | None = Field(
        default=None, description="this stage raises a PermanentError (to show a failed stage)"
    )
    skip_index: bool = Field(default=False, description="index's `when` says no")
    stage_sleep_s: float = Field(
        default=0.0, ge=0, le=30, description="each stage waits this long, cancellably"
    )
    max_files: int = Field(default=200, ge=1, le=500)


def _demo_stage_start(ctx: TaskContext, params: DemoPipelineInput, stage: str) -> None:
    if params.stage_sleep_s:
        ctx.sleep(params.stage_sleep_s)
    if params.fail_stage == stage:
        raise PermanentError(f"asked to fail in {stage} (fail_stage)")


def _probe(ctx: TaskContext, params: DemoPipelineInput) -> dict[str, object]:
    _demo_stage_start(ctx, params, "probe")
    with open_folder(params.path) as folder:
        sizes: dict[str, int] = {}
        for relative in _files(folder, params.max_files):
            with folder.open(relative) as handle:
                sizes[str(relative)] = os.fstat(handle.fileno()).st_size
    if not sizes:
        ctx.warn(f"{params.path} holds no files")
    ctx.log(f"found {len(sizes)} files under {params.path}")
    return {"sizes": sizes}


def _checksum(ctx: TaskContext, params: DemoPipelineInput) -> dict[str, object]:
    _demo_stage_start(ctx, params, "checksum")
    sizes: dict[str, int] = ctx.results["probe"]["sizes"]
    digests: dict[str, str] = {}
    began = time.process_time()
    with open_folder(params.path) as folder:
        for index, relative in enumerate(sizes, start=1):
            ctx.raise_if_cancelled()
            digests[relative] = _sha256(folder, PurePosixPath(relative))
            ctx.report_progress(index, len(sizes))
    ctx.spend("cpu_seconds", round(time.process_time() - began, 6))
    ctx.count("bytes_hashed", sum(sizes.values()))
    return {"sha256": digests}


def _index(ctx: TaskContext, params: DemoPipelineInput) -> dict[str, object]:
    _demo_stage_start(ctx, params, "index")
    sizes: dict[str, int] = ctx.results["probe"]["sizes"]
    target = Path(tempfile.gettempdir()) / "lumastra-demo-index" / f"{ctx.run_id}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"folder": str(params.path), "files": sizes}, indent=2))
    ctx.log(f"wrote the index of {len(sizes)} files to {target}")
    return {"index_file": str(target)}


def _summary(ctx: TaskContext, params: DemoPipelineInput) -> dict[str, object]:
    _demo_stage_start(ctx, params, "summary")
    sizes: dict[str, int] = ctx.results["probe"]["sizes"]
    return {
        "files": len(sizes),
        "bytes": sum(sizes.values()),
        "checksummed": len(ctx.results["checksum"]["sha256"]),
    }


demo_pipeline_task = define_task(
    id="demo-pipeline",
    resource_class="io",
    input_model=DemoPipelineInput,
    identity_for=lambda params: str(params.path),
    pipeline=[
        Stage(name="probe", execute=_probe),
        Stage(name="checksum", execute=_checksum, after=("probe",), resource_class="cpu"),
        Stage(
            name="index",
            execute=_index,
            after=("probe",),
            when=lambda ctx: not ctx.input.skip_index,
        ),
        Stage(name="summary", execute=_summary, after=("checksum",)),
    ],
    description="probe a folder, then checksum (cpu) and index (io) it, then sum it up",
)
