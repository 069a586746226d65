"""Server-Sent Events as the streams of the API write them (`logs`, `events`)."""

from __future__ import annotations

import json
from typing import Any

KEEP_ALIVE = ": keep-alive\n\n"


def event(name: str, data: dict[str, Any], event_id: int | None = None) -> str:
    """One event: `id:` when it has one (a client resumes after it with Last-Event-ID)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, default=str)}\n\n"
