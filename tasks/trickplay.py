"""The trickplay provider (issue 41): `define_trickplay` says which task makes an item's
trickplay (a tile sprite and its WebVTT index) and where its files are, so the API serves them
to players and asks for them when they are missing.

    trickplay = define_trickplay(
        task="trickplay",
        folder=lambda item_id: TRICKPLAY_ROOT / str(item_id),
        eligible=has_a_probed_video,
        input_for=lambda item_id: {"stage": "trickplay", "item_id": item_id},
        key_for=lambda item_id: f"coverage:trickplay:{item_id}",
    )

`GET /api/v1/items/{id}/trickplay.vtt` answers the item's index from `folder(id)/index`, its
tiles' URLs made relative to the API; `GET /api/v1/items/{id}/trickplay/{name}` answers a tile
image from the same folder and nowhere else. An eligible item without an index yet is answered
404 with the run that makes it (`queued`), started at priority 2 under `key_for(id)`, so any
number of players asking start one run, which is also the item's coverage run when the key is
its coverage key. `eligible` should say no for an item whose trickplay failed for good, or
every player's poll starts another run. A registry holds at most one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import ManifestError


@dataclass(frozen=True)
class TrickplayDefinition:
    task: str  # the task that makes one item's trickplay
    folder: Callable[[int], Path]  # where an item's files are
    eligible: Callable[[int], bool]  # whether the item can have trickplay (a video to read)
    input_for: Callable[[int], dict[str, Any]]  # the task's input for an item
    key_for: Callable[[int], str]  # the idempotency key of an item's run
    index: str  # the WebVTT file's name in an item's folder


def define_trickplay(
    *,
    task: str,
    folder: Callable[[int], Path],
    eligible: Callable[[int], bool],
    input_for: Callable[[int], dict[str, Any]],
    key_for: Callable[[int], str],
    index: str = "index.vtt",
) -> TrickplayDefinition:
    """Declare the trickplay provider. Assign the result to a module-level name in a module the
    registry loads."""

    def fail(field: str, problem: str) -> ManifestError:
        return ManifestError("trickplay", field, problem, what="trickplay provider")

    if not isinstance(task, str) or not task:
        raise fail("task", "must name the task that makes an item's trickplay")
    functions = (
        ("folder", folder),
        ("eligible", eligible),
        ("input_for", input_for),
        ("key_for", key_for),
    )
    for name, value in functions:
        if not callable(value):
            raise fail(name, "must be a function of the item's id")
    if not isinstance(index, str) or not index.endswith(".vtt") or "/" in index:
        raise fail("index", "must be a file name ending in .vtt")
    return TrickplayDefinition(task, folder, eligible, input_for, key_for, index)
