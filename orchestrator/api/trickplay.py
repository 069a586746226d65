"""`GET /items/{item_id}/trickplay.vtt` and `GET /items/{item_id}/trickplay/{name}` (issue 41):
an item's trickplay, as the registry's trickplay provider (`define_trickplay`) makes it, served
to players.

- The index is the item's WebVTT file, its cues' image references made relative to this API
  (`sprite.jpg#xywh=…` becomes `trickplay/sprite.jpg#xywh=…`, which a player resolves against
  the index's URL). A tile is an image file of the item's folder, named by a plain file name:
  a name that could leave the folder, a path that resolves outside it (a link), or an item
  folder that is itself a link, is a 404.
  Both carry an ETag (the file's mtime and size; `If-None-Match` answers 304) and
  `Cache-Control: private` (they are behind the API's authentication), the index for a minute
  (the stage may make it again), a tile for a day: the index names each tile with its ETag
  (`?v=`), so a sprite made again is a new URL.
- An item the provider says can have trickplay and has no index yet is answered 404 with
  `queued`, the run that makes it: started at priority 2 under the provider's key, so any number
  of players asking start one run (a live run with the key is joined). Its status says it is
  queued: `code: trickplay_queued`. An item that cannot have it is a plain 404.

Reading needs view permission; the run a read starts is the API's (trigger `api`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from orchestrator.api.auth import VIEW
from orchestrator.api.errors import answers
from orchestrator.api.starting import start_refusals
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind
from tasks import registry

router = Router(tags=["trickplay"])

# The index's priority: a player waits for it.
PRIORITY = 2
INDEX_MAX_AGE_S = 60
TILE_MAX_AGE_S = 86_400
TILE_TYPES = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
}
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_CUE_TIMING = re.compile(r"^\S+ --> \S+")
NO_PROVIDER = "no trickplay provider is declared (define_trickplay)"


@router.get(
    "/items/{item_id}/trickplay.vtt", auth=VIEW, response=answers({200: None}, 404, 409, 422)
)
def trickplay_index(request: HttpRequest, item_id: int) -> HttpResponse | FileResponse:
    """The item's trickplay index (WebVTT); 404 with `queued` (a run id) while it is being made
    for an item that can have one."""
    provider = registry.get().trickplay
    if provider is None:
        return _not_found(NO_PROVIDER)
    folder = provider.folder(item_id)
    index = _inside(folder, provider.index)
    if index is None:
        if not provider.eligible(item_id):
            return _not_found(f"item {item_id} has no trickplay and cannot have one")
        with start_refusals():
            run = start_run(
                provider.task,
                provider.input_for(item_id),
                trigger=TriggerKind.API,
                priority=PRIORITY,
                idempotency_key=provider.key_for(item_id),
            )
        return JsonResponse(
            {
                "detail": f"item {item_id} has no trickplay yet: run {run.run_id} makes it",
                "code": "trickplay_queued",
                "queued": run.run_id,
            },
            status=404,
        )
    return _served(
        request,
        index,
        INDEX_MAX_AGE_S,
        lambda: HttpResponse(
            _relative(index.read_text(), folder), content_type="text/vtt; charset=utf-8"
        ),
    )


@router.get("/items/{item_id}/trickplay/{name}", auth=VIEW, response=answers({200: None}, 404, 422))
def trickplay_tile(request: HttpRequest, item_id: int, name: str) -> HttpResponse | FileResponse:
    """One tile image of the item's trickplay, from its folder only."""
    provider = registry.get().trickplay
    if provider is None:
        return _not_found(NO_PROVIDER)
    content_type = TILE_TYPES.get(Path(name).suffix.lower())
    tile = _inside(provider.folder(item_id), name) if content_type else None
    if tile is None:
        return _not_found(f"item {item_id} has no trickplay image {name!r}")
    return _served(
        request,
        tile,
        TILE_MAX_AGE_S,
        lambda: FileResponse(tile.open("rb"), content_type=content_type),
    )


def _inside(folder: Path, name: str) -> Path | None:
    """`folder/name` if it is a file that resolves inside `folder` (no link out, no `..`), and
    `folder` itself is reached through no link."""
    if not _PLAIN_NAME.match(name) or ".." in name:
        return None
    try:
        root = folder.resolve(strict=True)
        found = (root / name).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if root != Path(os.path.abspath(folder)):
        return None
    return found if found.is_file() and found.is_relative_to(root) else None


def _etag(path: Path) -> str:
    stat = path.stat()
    return f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'


def _served(
    request: HttpRequest,
    path: Path,
    max_age_s: int,
    respond: Callable[[], HttpResponse | FileResponse],
) -> HttpResponse | FileResponse:
    """`respond()`'s answer for `path`, or 304 when the client holds this version of it; either
    with the file's ETag (one `stat`) and its caching."""
    etag = _etag(path)
    asked = {tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")}
    response = HttpResponse(status=304) if etag in asked else respond()
    response["ETag"] = etag
    response["Cache-Control"] = f"private, max-age={max_age_s}"
    return response


def _relative(index: str, folder: Path) -> str:
    """The index with each cue's image reference relative to `trickplay/` and versioned by the
    image's ETag, so a sprite made again is fetched again whatever a player cached."""
    lines = index.splitlines()
    for number, line in enumerate(lines[:-1]):
        payload = lines[number + 1]
        if _CUE_TIMING.match(line) and payload and "://" not in payload:
            name, _, fragment = payload.lstrip("/").partition("#")
            image = _inside(folder, name)
            version = f"?v={_etag(image).strip(chr(34))}" if image else ""
            lines[number + 1] = f"trickplay/{name}{version}{'#' if fragment else ''}{fragment}"
    return "\n".join(lines) + "\n"


def _not_found(detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=404)
