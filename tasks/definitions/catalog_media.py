"""The demo's media work on the catalog's real files (`load_demo_catalog --files` writes short
videos and audio with ffmpeg): two covered stages that run ffmpeg's own tools.

- `probe` (`media-probe`, io): ffprobe reads a movie's, episode's or track's file; its length
  and streams are stored on the file (`media_files.duration_s`, `.streams`) and `probed_at`
  is set, so the catalog's trigger emits `file.content_changed` and the outbox resets what
  depends on the probe (`trickplay`, `checksum`);
- `trickplay` (`trickplay`, cpu): for a probed video, ffmpeg takes a frame every few seconds
  into one JPEG tile sprite plus a WebVTT index of the tiles, below LUMASTRA_TRICKPLAY_ROOT;
  players read them through the API (`define_trickplay`), which asks for one not made yet.

Both run their command through `ctx.run_process`, so a cancel, a timeout, a dead pool child or
a worker's stop takes ffmpeg with it. A file ffmpeg cannot read fails the run `permanent` with
ffmpeg's own words; anything else it fails for (a signal, a full disk) is tried again.
ffmpeg and ffprobe come from Debian's `ffmpeg` package.

The inbound trigger `download-finished` (`POST /api/v1/triggers/download-finished` with
`{"item_id": N}`, signed with `LUMASTRA_TRIGGER_SECRET_DOWNLOAD_FINISHED`) probes an item's
file as soon as a download client says it is there, instead of at the stage-sweep's next pass.
Its run carries the probe's coverage key, so it is the item's coverage run (the row follows
it) and a retry of the same event, or the sweep, joins it instead of probing twice.

The file is checked through the media roots (`open_folder`, no link followed) and then named
to the command, which opens it again by name: a file swapped between the two is not guarded.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.utils import timezone

from tasks import (
    CoverageItem,
    CoveredStage,
    ErrorKind,
    ProcessResult,
    TaskContext,
    define_task,
    define_trickplay,
    define_trigger,
    open_folder,
    skipped,
)
from tasks.definitions.catalog import HAS_PRESENT_FILE

FFPROBE = "ffprobe"
FFMPEG = "ffmpeg"
# What ffmpeg and ffprobe say of input they can never read (the demo's corrupt files, a
# truncated download): failing again would fail the same way.
UNREADABLE = (
    "Invalid data found when processing input",
    "corrupt decoded frame",
    "EBML header parsing failed",
    "moov atom not found",
    "End of file",
)
# One frame every TRICKPLAY_EVERY_S seconds, at most MAX_TILES of them (a longer video spaces
# them out), each TILE_WIDTH pixels wide, TILE_COLUMNS to a row of the sprite.
TRICKPLAY_EVERY_S = 2.0
MAX_TILES = 100
TILE_WIDTH = 160
TILE_COLUMNS = 10
SPRITE = "sprite.jpg"
INDEX = "index.vtt"

# A present file whose last probe found a video stream.
HAS_PROBED_VIDEO = (
    "EXISTS (SELECT 1 FROM media_file_items fi JOIN media_files f ON f.id = fi.file_id"
    " WHERE fi.item_id = mi.id AND NOT f.is_missing"
    """ AND f.streams @> '[{"type": "video"}]'::jsonb)"""
)


def _unreadable(result: ProcessResult) -> ErrorKind:
    said = "\n".join(result.tail)
    if result.exit_code > 0 and any(words in said for words in UNREADABLE):
        return ErrorKind.PERMANENT
    return ErrorKind.TRANSIENT


def _present_file(item_id: int) -> Any:
    from coverage.models import MediaFile

    return (
        MediaFile.objects.filter(links__item_id=item_id, is_missing=False)
        .only("id", "path", "duration_s", "streams")
        .order_by("id")
        .first()
    )


@contextmanager
def _confined(path: str) -> Iterator[tuple[Path, str]]:
    """The file's folder, opened through the media roots, and the name to give the command
    (`./name`: a file named like an option stays a file)."""
    where = Path(path)
    with open_folder(where.parent) as folder:
        folder.open(PurePosixPath(where.name)).close()  # a link or a FIFO is refused here
        yield folder.path, f"./{where.name}"


def _stream(raw: dict[str, Any]) -> dict[str, Any]:
    stream = {"type": raw.get("codec_type", "unknown"), "codec": raw.get("codec_name", "")}
    if stream["type"] == "video":
        stream |= {"width": int(raw.get("width") or 0), "height": int(raw.get("height") or 0)}
    return stream


def _media_probe(ctx: TaskContext, params: CoverageItem) -> dict[str, Any]:
    from coverage.models import MediaFile

    file = _present_file(params.item_id)
    if file is None:
        return skipped("no-file")
    printed: list[str] = []
    with _confined(file.path) as (folder, name):
        ctx.run_process(
            [
                FFPROBE,
                "-v",
                "error",
                "-print_format",
                "json",
                "-show_streams",
                "-show_format",
                name,
            ],
            cwd=folder,
            on_stdout=printed.append,
            fails_as=_unreadable,
        )
    found = json.loads("\n".join(printed))
    duration = found.get("format", {}).get("duration")
    streams = [_stream(raw) for raw in found.get("streams", [])]
    duration_s = round(float(duration), 3) if duration else None
    # probed_at moves: the catalog's trigger emits `file.content_changed` for the file's items.
    MediaFile.objects.filter(pk=file.pk).update(
        duration_s=duration_s, streams=streams, probed_at=timezone.now()
    )
    return {"path": file.path, "duration_s": duration_s, "streams": streams}


media_probe_task = define_task(
    id="media-probe",
    resource_class="io",
    execute=_media_probe,
    input_model=CoverageItem,
    requires_commands=(FFPROBE,),
    description="reads a file's length and streams with ffprobe (covered stage `probe`)",
    covers_stages=[
        CoveredStage(
            id="probe",
            applies_to=("movie", "episode", "track"),
            eligible_sql=HAS_PRESENT_FILE,
            recover_when_additional_reasons=("no-file",),
            # Not `file.content_changed`: the probe's own write emits it. A file rewritten on
            # disk (`file.modified`) is probed again, and its new probe resets the rest.
            invalidated_by=(
                "file.linked",
                "file.unlinked",
                "file.modified",
                "file.presence_changed",
            ),
        )
    ],
)


def _timestamp(seconds: float) -> str:
    millis = round(seconds * 1000)
    minutes, millis = divmod(millis, 60_000)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:{millis / 1000:06.3f}"


def _index(sprite: Sprite, duration_s: float) -> str:
    cues = ["WEBVTT", ""]
    width, height = TILE_WIDTH, sprite.height
    for tile in range(sprite.tiles):
        start, end = tile * sprite.every_s, min((tile + 1) * sprite.every_s, duration_s)
        x, y = tile % TILE_COLUMNS * width, tile // TILE_COLUMNS * height
        cues += [
            f"{_timestamp(start)} --> {_timestamp(end)}",
            f"{SPRITE}#xywh={x},{y},{width},{height}",
            "",
        ]
    return "\n".join(cues)


@dataclass(frozen=True)
class Sprite:
    """How one video's trickplay sprite is laid out: a tile every `every_s` seconds."""

    every_s: float
    tiles: int
    columns: int
    rows: int
    height: int  # of a tile; its width is TILE_WIDTH

    @classmethod
    def of(cls, duration_s: float, width: int, height: int) -> Sprite:
        every_s = max(TRICKPLAY_EVERY_S, duration_s / MAX_TILES)
        tiles = max(1, math.ceil(duration_s / every_s))
        return cls(
            every_s=every_s,
            tiles=tiles,
            columns=min(tiles, TILE_COLUMNS),
            rows=math.ceil(tiles / TILE_COLUMNS),
            height=max(2, round(TILE_WIDTH * height / width / 2) * 2),
        )

    def argv(self, name: str, output: Path) -> list[str]:
        """ffmpeg's command for the sprite of the video `name` (a path or `./file`)."""
        tile = f"fps=1/{self.every_s:g},scale={TILE_WIDTH}:{self.height}"
        return [
            FFMPEG, "-nostdin", "-hide_banner", "-v", "error", "-xerror", "-y",
            "-i", name, "-an", "-sn", "-vf", f"{tile},tile={self.columns}x{self.rows}",
            "-frames:v", "1", "-q:v", "5", "-progress", "pipe:1", str(output),
        ]  # fmt: skip


def _trickplay(ctx: TaskContext, params: CoverageItem) -> dict[str, Any]:
    file = _present_file(params.item_id)
    video = next((s for s in file.streams or () if s["type"] == "video"), None) if file else None
    if file is None or video is None or not file.duration_s or not video["width"]:
        return skipped("no-video")
    duration_s: float = file.duration_s
    sprite = Sprite.of(duration_s, video["width"], video["height"])
    output = settings.CONFIG.trickplay_root / str(params.item_id)
    output.mkdir(parents=True, exist_ok=True)
    partial = output / f"{SPRITE}.partial.jpg"
    total_us = int(duration_s * 1_000_000)

    def progress(line: str) -> None:
        # `-progress pipe:1` prints key=value lines; out_time_us is how far the input is read.
        key, _, value = line.partition("=")
        if key == "out_time_us" and value.isdigit():
            ctx.report_progress(min(int(value), total_us), total_us)

    try:
        with _confined(file.path) as (folder, name):
            ctx.run_process(
                sprite.argv(name, partial), cwd=folder, on_stdout=progress, fails_as=_unreadable
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        with suppress(OSError):
            output.rmdir()  # only when empty: an earlier sprite of the item stays
        raise
    os.replace(partial, output / SPRITE)
    written = output / f"{INDEX}.partial"
    written.write_text(_index(sprite, duration_s))
    os.replace(written, output / INDEX)
    return {"sprite": str(output / SPRITE), "index": str(output / INDEX), "tiles": sprite.tiles}


trickplay_task = define_task(
    id="trickplay",
    resource_class="cpu",
    execute=_trickplay,
    input_model=CoverageItem,
    requires_commands=(FFMPEG,),
    description="a tile sprite and WebVTT index of a video's frames, with ffmpeg "
    "(covered stage `trickplay`)",
    covers_stages=[
        CoveredStage(
            id="trickplay",
            applies_to=("movie", "episode"),
            eligible_sql=HAS_PROBED_VIDEO,
            recover_when_additional_reasons=("no-video",),
            invalidated_by=("file.linked", "file.unlinked", "file.content_changed"),
        )
    ],
)


# A movie or episode with a probed video whose trickplay did not fail or skip for good: a player
# asking again for one that did starts no new run.
_CAN_HAVE_TRICKPLAY = (
    "SELECT EXISTS (SELECT 1 FROM media_items mi WHERE mi.id = %s"  # noqa: S608 (constants)
    " AND mi.kind IN ('movie', 'episode') AND " + HAS_PROBED_VIDEO + " AND NOT EXISTS"
    " (SELECT 1 FROM media_item_stage_state s WHERE s.item_id = mi.id AND s.stage = 'trickplay'"
    " AND s.status IN ('failed_permanent', 'skipped_permanent')))"
)


def _can_have_trickplay(item_id: int) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(_CAN_HAVE_TRICKPLAY, [item_id])
        return bool(cursor.fetchone()[0])


def _trickplay_key(item_id: int) -> str:
    from coverage.sweep import run_key

    return run_key("trickplay", item_id)


# Players read an item's sprite and index through the API (`/items/{id}/trickplay.vtt`); one
# asked for before the sweep made it is made at once, as the item's coverage run.
trickplay_provider = define_trickplay(
    task="trickplay",
    folder=lambda item_id: settings.CONFIG.trickplay_root / str(item_id),
    eligible=_can_have_trickplay,
    input_for=lambda item_id: {"stage": "trickplay", "item_id": item_id},
    key_for=_trickplay_key,
    index=INDEX,
)


def _coverage_key(body: dict[str, Any]) -> str:
    # Imported here: the catalog's sweep imports the engine, which loads this module.
    from coverage.sweep import run_key

    return run_key("probe", int(body["item_id"]))


download_finished = define_trigger(
    name="download-finished",
    task="media-probe",
    input_from=lambda body: {"stage": "probe", "item_id": body["item_id"]},
    idempotency_key_from=_coverage_key,
    description="a download client finished an item's file: probe it now",
)
