"""The web role's HTTP server: uvicorn, with limits that keep slow clients from holding it.

`python -m lumastra.web [uvicorn options]` (what `deploy/start-web.sh` runs) serves
`lumastra.asgi:application` with these settings from `lumastra.config`:

- `LUMASTRA_WEB_LIMIT_CONCURRENCY` (uvicorn's `--limit-concurrency`): with that many open
  connections or running requests, a new request is answered 503 at once instead of queueing.
- `LUMASTRA_WEB_KEEP_ALIVE_S` (`--timeout-keep-alive`): an idle connection between requests
  is closed after this long.
- `LUMASTRA_WEB_READ_TIMEOUT_S` and `LUMASTRA_WEB_MAX_HEADER_BYTES`, enforced by
  `HttpProtocol` below. uvicorn's httptools protocol has no deadline for a request's headers
  and no bound on their size, so a client sending one byte a second, or headers without end,
  would hold its connection (and a place under the concurrency limit) for as long as it
  likes. The request body gets the same deadline from `orchestrator.api.limits.BodyLimit`.

Extra arguments go to uvicorn after these and override them (e.g. `--workers 4`). Choosing
another HTTP implementation (`--http h11`) drops `HttpProtocol`'s guards.

What this does not do: it is not a reverse proxy. Enough clients, from enough addresses, can
still fill the concurrency limit one read timeout at a time; a web role reachable from an
untrusted network belongs behind a proxy that limits connections per address.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from types import FrameType
from typing import Any

import uvicorn.main
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.config import Config as UvicornConfig
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from lumastra.config import Config, current

# When the server stops, a response still being sent this long after is closed: a stream (the
# console's /events, a run's live log) never ends by itself, and uvicorn would wait for it as
# long as its page stays open (honcho kills the role after 5 s, compose after 10); any other
# response is sent whole long before.
STREAM_CLOSE_AFTER_S = 1.0


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size bound on each request head.

    The deadline starts when the connection opens, and again when the first byte of each
    further request on it arrives; the head must be complete within it (else 408 and close).
    A head larger than the bound gets 431 and the connection is closed; the bound is checked
    per read, so up to one read (at most 256 KiB) more may be buffered before the refusal.
    At shutdown it also ends the streams still open (`STREAM_CLOSE_AFTER_S`).
    """

    def __init__(
        self,
        config: UvicornConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        settings = current()
        self._head_timeout_s = settings.web_read_timeout_s
        self._max_head_bytes = settings.web_max_header_bytes
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._reading_head = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """The server stops (SIGTERM, SIGINT): uvicorn lets the response in flight finish;
        one still being sent STREAM_CLOSE_AFTER_S later is a stream, and is closed."""
        super().shutdown()
        if self.cycle is not None and not self.cycle.response_complete:
            self.loop.call_later(STREAM_CLOSE_AFTER_S, self._close_stream)

    def _close_stream(self) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete or self.transport.is_closing():
            return
        if cycle.response_started:
            # As for a client that left: Django stops the stream; an EventSource reconnects
            # (to another replica) and asks for what it missed (Last-Event-ID).
            self.transport.close()
        else:
            # Still working on its answer: that may take the time it needs.
            self.loop.call_later(STREAM_CLOSE_AFTER_S, self._close_stream)

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if (
            self._reading_head
            and self._head_bytes > self._max_head_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(431, _too_large(self._max_head_bytes))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._reading_head:
            self._expect_head()

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        self._reading_head = False
        self._head_bytes = 0
        # A head that arrived in one read was never seen incomplete; measure what was parsed.
        size = len(self.url) + sum(len(name) + len(value) for name, value in self.headers)
        if size <= self._max_head_bytes:
            super().on_headers_complete()
            return
        # uvicorn then runs this request's cycle (and discards its body) with `_head_too_large`
        # in place of the application.
        app, self.app = self.app, _head_too_large(self._max_head_bytes)
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def _expect_head(self) -> None:
        self._reading_head = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:
            self._refuse(408, f"request headers did not arrive within {self._head_timeout_s} s")
        else:
            # Nothing was asked (an idle or pre-opened connection): nothing to answer.
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        self._stop_head_timer()
        body = message.encode()
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: %d\r\n" % len(body),
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()


def _too_large(limit: int) -> str:
    return f"request headers exceed {limit} bytes"


def _head_too_large(limit: int) -> ASGI3Application:
    async def refuse(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        body = _too_large(limit).encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 431, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return refuse


def uvicorn_arguments(settings: Config) -> list[str]:
    return [
        "lumastra.asgi:application",
        "--host",
        settings.web_host,
        "--port",
        str(settings.web_port),
        "--http",
        "lumastra.web:HttpProtocol",
        "--timeout-keep-alive",
        str(settings.web_keep_alive_s),
        "--limit-concurrency",
        str(settings.web_limit_concurrency),
        # Django's ASGI handler has no lifespan protocol; "off" spares a warning at every start.
        "--lifespan",
        "off",
    ]


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> None:
    if not current().metrics_token:
        print(
            "lumastra web: /metrics is disabled: LUMASTRA_METRICS_TOKEN is unset", file=sys.stderr
        )
    # A stop asked for (a deploy's SIGTERM, Ctrl+C) ends the role with 0. uvicorn shuts down
    # gracefully on either, then restores the handlers it found and raises the signal again,
    # so that Python's default would end the process by it (143 for SIGTERM). The handler it
    # finds and raises is this one: exit 0 once the shutdown is done, or at once if the signal
    # comes before uvicorn listens. (`--workers N` supervises its processes itself.)
    signal.signal(signal.SIGTERM, _stopped)
    signal.signal(signal.SIGINT, _stopped)
    uvicorn.main.main(args=[*uvicorn_arguments(current()), *argv], prog_name="uvicorn")


if __name__ == "__main__":
    main(sys.argv[1:])
