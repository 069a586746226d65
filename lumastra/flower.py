"""Flower behind one gate: every path needs credentials, every request a configured host.

`python -m lumastra.flower [flower options]` runs what `celery -A lumastra flower` runs, with
one change. Flower 2.2 checks its `--basic-auth` credentials only in the handlers it marks
`@authenticated`; `/metrics` and `/healthcheck` (meant for Prometheus and load balancers),
`/static/…`, `/login` and unknown paths answer anyone, and any `Host` is served, which
leaves it open to DNS rebinding. `GuardedFlower` checks the host and then the credentials
before routing, so no handler is reached without both.

- Credentials: `FLOWER_BASIC_AUTH`, `user:password` pairs separated by commas. Without it the
  launcher refuses to start. `make run` provides the demo user's.
- Hosts: `LUMASTRA_ALLOWED_HOSTS`, matched as Django matches `ALLOWED_HOSTS` (the port is
  ignored, `.example.com` covers its subdomains, `*` allows any). Another host gets 400.

What it does not do: basic auth sends the password with every request, readable on plain
HTTP; keep Flower on localhost or behind TLS. Failed attempts are not rate-limited.
"""

from __future__ import annotations

import atexit
import binascii
import contextlib
import hmac
import signal
import sys
from base64 import b64decode
from collections.abc import Sequence
from typing import Any

import tornado.web
from django.http.request import split_domain_port, validate_host
from flower import command  # type: ignore[import-untyped]
from flower.app import Flower  # type: ignore[import-untyped]
from flower.urls import settings as flower_settings  # type: ignore[import-untyped]
from tornado.httputil import HTTPServerRequest
from tornado.options import options

from lumastra.celery import app as celery_app
from lumastra.config import current


class _Refused(tornado.web.RequestHandler):
    """Answers every method with `status`; nothing else of Flower runs."""

    def initialize(self, status: int, message: str) -> None:
        self._status = status
        self._message = message

    def check_xsrf_cookie(self) -> None:
        # Runs before `prepare` for writes; a refused request has nothing to protect.
        pass

    def prepare(self) -> None:
        self.set_status(self._status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        if self._status == 401:
            self.set_header("WWW-Authenticate", 'Basic realm="flower"')
        self.finish(self._message)


class GuardedFlower(Flower):  # type: ignore[misc]
    def __init__(
        self, *, credentials: Sequence[str], allowed_hosts: Sequence[str], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._credentials = [c.encode() for c in credentials]
        self._allowed_hosts = list(allowed_hosts)

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> Any:
        domain, _ = split_domain_port(request.host)
        if not domain or not validate_host(domain, self._allowed_hosts):
            return self._refuse(request, 400, f"host {request.host!r} is not allowed")
        if not self._authorized(request.headers.get("Authorization", "")):
            return self._refuse(request, 401, "authentication required")
        return super().find_handler(request, **kwargs)

    def _authorized(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            presented = b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        # Every pair is compared, so the time taken does not tell which one came close.
        matches = [hmac.compare_digest(presented, known) for known in self._credentials]
        return any(matches)

    def _refuse(self, request: HTTPServerRequest, status: int, message: str) -> Any:
        return self.get_handler_delegate(request, _Refused, {"status": status, "message": message})


def main(argv: list[str]) -> None:
    settings = current()
    if not settings.flower_basic_auth:
        sys.exit("FLOWER_BASIC_AUTH is not set: Flower needs user:password credentials")
    # Flower's own option handling (FLOWER_* variables, then the command line), as its
    # `celery flower` command does it; the credentials are ours, whatever else was given.
    command.apply_env_options()
    command.apply_options(sys.argv[0], argv)
    options.basic_auth = list(settings.flower_basic_auth)
    command.extract_settings()
    command.setup_logging()

    app = GuardedFlower(
        credentials=settings.flower_basic_auth,
        allowed_hosts=settings.allowed_hosts,
        capp=celery_app,
        options=options,
        **flower_settings,
    )
    atexit.register(app.stop)
    signal.signal(signal.SIGTERM, command.sigterm_handler)
    port = app.start_http_server()
    command.print_banner(celery_app, "ssl_options" in flower_settings, port)
    # Ctrl+C, or SIGTERM through Flower's handler (sys.exit): a normal stop.
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        app.start()


if __name__ == "__main__":
    main(sys.argv[1:])
