"""`GET /runs/{run_id}/logs`: a run's log, followed live over Server-Sent Events.

The stream is served by the web role's event loop (ASGI), not a thread per client: the view
checks the caller and the run, then hands Django an async iterator. It sends the lines still
in Valkey after the client's `Last-Event-ID` (or `?after=`), then each new batch as the run's
log announces it (`<ns>:task:logfeed:<runId>`), every line as an `event: log` with `id: <seq>`, so a
client that reconnects with the last id it saw gets no gap and no repeat; a `: keep-alive`
comment every LUMASTRA_SSE_KEEPALIVE_S while nothing happens; and `event: end` with the run's
state once the run has ended and every line was sent. `?follow=false` answers the lines as
JSON instead. A run whose live log has expired (after 24 hours) answers the tail kept on its
row (`log_tail` of its steps), then `end`.

Not guaranteed: lines trimmed from the live log (past LUMASTRA_LOG_CAP) before a client asked
for them are not sent; under WSGI (the test client) the stream is consumed synchronously.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import Field, Router, Schema

from orchestrator.api import sse
from orchestrator.api.auth import VIEW
from orchestrator.api.errors import ApiError, answers
from orchestrator.models import TaskHistory
from orchestrator.runs import context
from orchestrator.states import TERMINAL_RUN_STATES
from orchestrator.stores import keys, valkey
from orchestrator.text import is_ascii_digits, is_run_id

router = Router(tags=["runs"])


class LogLine(Schema):
    """One line of a run's log, as `follow=false` answers it and each `log` event carries."""

    seq: int | None = Field(
        None, description="its id in the live log; absent in a tail kept on the run's row"
    )
    ts: str = Field(description="when it was written (ISO 8601)")
    level: str = Field(description="info, warning, error, …")
    stage: str | None = Field(description="the pipeline stage that wrote it, if any")
    msg: str


# How often a follower looks whether the run has ended while its log is quiet.
STATE_CHECK_S = 1.0
_TERMINAL = {state.value for state in TERMINAL_RUN_STATES}


@router.get(
    "/runs/{run_id}/logs",
    auth=VIEW,
    response=answers({200: list[LogLine]}, 404, 422),
    # Both answers: ninja would document only the JSON, and a single `content` only one.
    openapi_extra={
        "responses": {
            "200": {
                "description": "the lines: a stream by default, JSON with follow=false",
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/LogLine"},
                        }
                    },
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            }
        }
    },
)
def run_logs(
    request: HttpRequest, run_id: str, follow: bool = True, after: int = 0
) -> HttpResponse | StreamingHttpResponse:
    """The run's log lines: a Server-Sent Events stream (`follow=true`, the default: `log`
    events with `id: <seq>`, keep-alive comments, an `end` event), or JSON (`follow=false`).
    `Last-Event-ID` (or `after`) resumes after the line with that id."""
    if not is_run_id(run_id):
        raise ApiError(404, f"no run {run_id!r}")
    steps = TaskHistory.objects.filter(id=run_id).values_list("steps", flat=True).first()
    if steps is None:
        raise ApiError(404, f"no run {run_id!r}")
    resume = request.headers.get("Last-Event-ID", "").strip()
    if resume:
        if not is_ascii_digits(resume) or len(resume) > 18:
            raise ApiError(422, "Last-Event-ID must be the id of a line this stream sent")
        after = int(resume)
    if after < 0:
        raise ApiError(422, "after must be >= 0")
    lines = [{"seq": line.seq, **line.entry} for line in context.read_log(run_id, after)]
    if not lines and after == 0:
        lines = _kept_tail(steps)
    if not follow:
        return JsonResponse(lines, safe=False)
    response = StreamingHttpResponse(
        _follow(run_id, after, lines), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the stream back
    return response


def _kept_tail(steps: dict[str, Any]) -> list[dict[str, Any]]:
    """The tail the run's row kept, step by step (no seq: the live log's numbers are gone)."""
    return [
        entry
        for record in steps.values()
        if isinstance(record, dict)
        for entry in record.get("log_tail", [])
    ]


def _event(entry: dict[str, Any]) -> str:
    return sse.event("log", entry, entry.get("seq"))


async def _follow(run_id: str, after: int, first: list[dict[str, Any]]) -> AsyncIterator[str]:
    client = valkey.async_client()
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.run_log_feed(run_id))
    try:
        for entry in first:
            yield _event(entry)
        last = max([after, *(e["seq"] for e in first if "seq" in e)])
        quiet = 0.0
        while True:
            fresh = await _read(client, run_id, last)
            for line in fresh:
                yield _event({"seq": line.seq, **line.entry})
                last = line.seq
            if not fresh:
                state = await _ended(client, run_id)
                if state is not None:
                    # Lines are sent before the run's end is written: one last read has them.
                    for line in await _read(client, run_id, last):
                        yield _event({"seq": line.seq, **line.entry})
                    yield sse.event("end", {"state": state})
                    return
            message = await pubsub.get_message(timeout=STATE_CHECK_S)
            quiet = 0.0 if message is not None or fresh else quiet + STATE_CHECK_S
            if quiet >= settings.CONFIG.sse_keepalive_s:
                quiet = 0.0
                yield sse.KEEP_ALIVE
    finally:
        await pubsub.unsubscribe()
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def _read(client: Any, run_id: str, after: int) -> list[context.LogLine]:
    return context.parsed_log(await client.lrange(keys.run_log(run_id), 0, -1), after)


async def _ended(client: Any, run_id: str) -> str | None:
    """The run's terminal state once it has ended, else None: the live hash says, or the
    terminal snapshot; Postgres only when Valkey holds neither."""
    state = await client.hget(keys.run_active(run_id), "state")
    if state is None:
        state = await client.hget(keys.run_terminal(run_id), "state")
    if state is None:
        state = await _durable_state(run_id)
    return state if state in _TERMINAL else None


@sync_to_async
def _durable_state(run_id: str) -> str | None:
    return TaskHistory.objects.filter(id=run_id).values_list("state", flat=True).first()
