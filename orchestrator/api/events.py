"""`GET /events`: runs' events over Server-Sent Events, for all runs or one task or one run, so
a page can follow them without polling.

Two sources, merged on the web role's event loop (no thread per client):
- **State changes** (`event: run`: created as pending, started, cancelling, completed, failed,
  cancelled) come from `task_history_audit`, which Postgres itself writes with every change
  of a run's state: durable and ordered, each with `id: <audit id>`, so a client that
  reconnects with `Last-Event-ID` gets every change it missed (the audit is kept with the
  runs). A new stream starts after the latest change.
- **Live events** (`event: progress`, `event: stage`) come from Valkey (`<ns>:task:events`,
  published with each progress write and stage move): live only, without ids.

The audit is read every POLL_S from TRAILING_IDS behind the last change seen (one indexed
query; a change whose transaction committed late still goes out), and a `: keep-alive` comment
goes out every LUMASTRA_SSE_KEEPALIVE_S while nothing happens.

Not guaranteed: live events sent while a client is away are not replayed; a change committed
more than TRAILING_IDS changes late is missed by streams already past it; each stream holds a
database connection and reads the audit itself (fine for operator pages, not for thousands
of clients).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Router

from orchestrator.api import sse
from orchestrator.api.auth import VIEW
from orchestrator.api.errors import ApiError, answers
from orchestrator.models import TaskHistory, TaskHistoryAudit
from orchestrator.stores import keys, valkey
from orchestrator.text import is_ascii_digits, is_run_id
from tasks import registry

router = Router(tags=["runs"])

POLL_S = 0.5
BATCH = 500
# Audit ids are handed out when a change is written and become visible when it commits, so a
# change can appear behind ones already sent (a long transaction): each poll reads again this
# many ids behind the last it saw, and sends only those it has not sent.
TRAILING_IDS = 2000


@router.get(
    "/events",
    auth=VIEW,
    response=answers({200: None}, 404, 422),
    openapi_extra={"responses": {"200": {"content": {"text/event-stream": {}}}}},
)
def events(
    request: HttpRequest, task: str | None = None, run: str | None = None
) -> StreamingHttpResponse:
    """Runs' events as Server-Sent Events: `run` (state changes, with ids: `Last-Event-ID`
    resumes), `progress` and `stage` (live). `task` or `run` narrows them to one task or run."""
    if task is not None and task not in registry.get():
        raise ApiError(404, f"unknown task {task!r}")
    if run is not None and not is_run_id(run):
        raise ApiError(404, f"no run {run!r}")
    resume = request.headers.get("Last-Event-ID", "").strip()
    if resume and (not is_ascii_digits(resume) or len(resume) > 18):
        raise ApiError(422, "Last-Event-ID must be the id of an event this stream sent")
    after = int(resume) if resume else _latest_change()
    response = StreamingHttpResponse(_stream(after, task, run), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _latest_change() -> int:
    latest = TaskHistoryAudit.objects.order_by("-id").values_list("id", flat=True).first()
    return latest or 0


async def _stream(after: int, task: str | None, run: str | None) -> AsyncIterator[str]:
    pubsub = valkey.async_client().pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.run_events())
    tasks_of: dict[str, str] = {}
    try:
        last = after
        # Ids read within the trailing window (sent, or not wanted): a late one is any other.
        seen: set[int] = set()
        quiet_since = time.monotonic()
        next_poll = 0.0
        while True:
            sent = False
            if time.monotonic() >= next_poll:
                changes, read = await _changes(after, last, seen, task, run)
                for change in changes:
                    yield sse.event("run", change, change["id"])
                    sent = True
                last = max([last, *read])
                seen = {i for i in (*seen, *read) if i > last - TRAILING_IDS}
                next_poll = time.monotonic() + POLL_S
            # Every live event that waits, not one per pass: a busy cluster must not pile up.
            message = await pubsub.get_message(timeout=POLL_S)
            while message is not None:
                live = json.loads(message["data"])
                if await _wanted(live, task, run, tasks_of):
                    yield sse.event(live["type"], live)
                    sent = True
                message = await pubsub.get_message(timeout=0)
            if sent:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= settings.CONFIG.sse_keepalive_s:
                quiet_since = time.monotonic()
                yield sse.KEEP_ALIVE
    finally:
        await pubsub.unsubscribe()
        await pubsub.aclose()  # type: ignore[no-untyped-call]


@sync_to_async
def _changes(
    floor: int, last: int, seen: set[int], task: str | None, run: str | None
) -> tuple[list[dict[str, Any]], list[int]]:
    """The state changes the stream wants, and every audit id read: those after `last`, and
    those within TRAILING_IDS behind it (never at or below `floor`, where the stream began)
    that were not `seen` (committed late)."""
    audit = TaskHistoryAudit.objects.order_by("id")
    if run is not None:
        audit = audit.filter(run_id=run)
    columns = ("id", "run_id", "from_state", "to_state", "at")
    late = audit.filter(id__gt=max(floor, last - TRAILING_IDS), id__lte=last).exclude(id__in=seen)
    rows = [*late.values(*columns), *audit.filter(id__gt=last).values(*columns)[:BATCH]]
    task_ids = dict(
        TaskHistory.objects.filter(id__in={row["run_id"] for row in rows}).values_list(
            "id", "task_id"
        )
    )
    wanted = [
        {
            "id": row["id"],
            "run_id": row["run_id"],
            "task": task_ids.get(row["run_id"], ""),
            "from": row["from_state"],
            "state": row["to_state"],
            "at": row["at"].isoformat(),
        }
        for row in rows
        if task is None or task_ids.get(row["run_id"]) == task
    ]
    return wanted, [row["id"] for row in rows]


async def _wanted(
    event: dict[str, Any], task: str | None, run: str | None, tasks_of: dict[str, str]
) -> bool:
    run_id = str(event.get("run_id", ""))
    if run is not None and run_id != run:
        return False
    if task is None:
        return True
    if run_id not in tasks_of:
        if len(tasks_of) > 10_000:
            tasks_of.clear()
        tasks_of[run_id] = await _task_of(run_id)
    event["task"] = tasks_of[run_id]
    return tasks_of[run_id] == task


@sync_to_async
def _task_of(run_id: str) -> str:
    found = TaskHistory.objects.filter(id=run_id).values_list("task_id", flat=True).first()
    return found or ""
