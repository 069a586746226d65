"""Request body limits, enforced before a body is read.

Django's ASGI handler reads a request's whole body (into a temporary file) before any
middleware runs, and only then compares it with `DATA_UPLOAD_MAX_MEMORY_SIZE`: a client that
declares 64 MiB and sends 1 MiB holds the request open waiting for the rest, and a full 64 MiB
upload is stored before its 413. `BodyLimit` wraps the Django application at the ASGI level
and decides first:

- a declared `Content-Length` over the limit is refused at once, without reading a byte;
- a body without a length (chunked) is read only until it passes the limit, then refused;
- a body that does not arrive within the read timeout is refused with 408.

API paths are held to `LUMASTRA_API_MAX_BODY_BYTES` and answer in the API's JSON error shape;
other paths (the admin) to `DATA_UPLOAD_MAX_MEMORY_SIZE` with a plain-text answer. Refusals
close the connection: the unread rest of the body is not worth receiving.

`BodySizeLimitMiddleware` gives the same 413 where there is no ASGI server in front (the WSGI
entry point, Django's test client).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

API_PREFIX = "/api/"

# The shapes Django's own ASGIHandler declares, so it can be wrapped as it is.
Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def too_large(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes"


class BodyLimit:
    """ASGI wrapper: refuses oversized or slow request bodies before `app` sees them."""

    def __init__(
        self, app: ASGIApp, *, api_limit: int, site_limit: int | None, read_timeout_s: float
    ) -> None:
        self.app = app
        self.api_limit = api_limit
        self.site_limit = site_limit
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_api = scope["path"].startswith(API_PREFIX)
        limit = self.api_limit if is_api else self.site_limit

        declared = _content_length(scope)
        if declared == -1:
            await _refuse(send, is_api, 400, "Content-Length is not a number")
            return
        if limit is not None and declared is not None and declared > limit:
            await _refuse(send, is_api, 413, too_large(limit))
            return

        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.read_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # the client left; nobody is waiting for an answer
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if limit is not None and size > limit:
                        await _refuse(send, is_api, 413, too_large(limit))
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            detail = f"the request body did not arrive within {self.read_timeout_s:g} seconds"
            await _refuse(send, is_api, 408, detail)
            return

        body: Message | None = {"type": "http.request", "body": b"".join(chunks)}

        async def replay() -> Message:
            # Django reads the body once, then listens on `receive` for the disconnect.
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    """The declared length; None when absent, -1 when it is not a non-negative number."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return -1
            return length if length >= 0 else -1
    return None


async def _refuse(send: Send, is_api: bool, status: int, detail: str) -> None:
    if is_api:
        body, content_type = json.dumps({"detail": detail}).encode(), b"application/json"
    else:
        body, content_type = detail.encode(), b"text/plain; charset=utf-8"
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodySizeLimitMiddleware:
    """The API's JSON 413 where Django itself reads the body (no `BodyLimit` in front).

    Django enforces `DATA_UPLOAD_MAX_MEMORY_SIZE` (set from `LUMASTRA_API_MAX_BODY_BYTES`) when
    the body is first read; reading it here turns that into the API's error shape.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            try:
                int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
            try:
                request.body  # noqa: B018 - reading is the check; views get the cached bytes
            except RequestDataTooBig:
                return JsonResponse(
                    {"detail": too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)}, status=413
                )
        return self.get_response(request)
