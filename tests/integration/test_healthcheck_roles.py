"""`manage.py healthcheck --role …` is true only when the role beside it works: the stores it
needs answer, and the role itself does its job (its own probe, its roster entries, its
process, its credentials prompt)."""

from __future__ import annotations

import dataclasses
import io
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings
from django.core.management import call_command

from orchestrator.cluster import roster
from orchestrator.stores import keys, valkey
from tests.support.servers import free_port, web_process

pytestmark = pytest.mark.django_db(transaction=True)


def _check(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("healthcheck", *args, stdout=out)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def empty_roster() -> Iterator[None]:
    client = valkey.client()
    for name in client.scan_iter(match=keys.cluster_node("*")):
        client.delete(name)
    yield
    for name in client.scan_iter(match=keys.cluster_node("*")):
        client.delete(name)


def _node(role: str, pools: tuple[str, ...], n: int, host: str | None = None) -> roster.Node:
    return roster.Node(
        instance_id=f"test-health-{role}-{n}",
        host=host or socket.gethostname(),
        pid=1000 + n,
        role=role,
        queues=(),
        started_at="2026-12-04T00:00:00+00:00",
        pools=pools,
    )


def test_a_worker_is_healthy_only_with_its_loops_pools_and_watcher_announced_here(
    empty_roster: None,
) -> None:
    pools = roster.host_pools()
    assert _check("--role", "worker")[0] == 1

    roster.announce(_node("loops", tuple(pools), 0))
    for n, pool in enumerate(pools[:-1], start=1):
        roster.announce(_node("worker", (pool,), n))
    roster.announce(_node("worker", (pools[-1],), 99, host="another-host"))
    code, out = _check("--role", "worker")
    assert code == 1 and f"pool {pools[-1]} fail" in out and "loops ok" in out

    roster.announce(_node("worker", (pools[-1],), len(pools)))
    code, out = _check("--role", "worker")
    assert code == 1 and "watcher fail" in out  # the file watcher is down

    roster.announce(_node("watcher", (), 100))
    code, out = _check("--role", "worker")
    assert code == 0, out
    assert "postgres ok" in out and f"pool {pools[0]} ok" in out and "watcher ok" in out


def test_beat_is_healthy_only_while_a_celery_beat_process_runs_here() -> None:
    assert _check("--role", "beat")[0] == 1

    # A process whose command line is `… celery … beat`, as deploy/start-beat.sh runs it.
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "celery", "beat"]
    beat = subprocess.Popen(argv)
    try:
        code, out = _check("--role", "beat")
        assert code == 0 and "beat ok" in out
    finally:
        beat.kill()
        beat.wait()


@contextmanager
def _answering(status: int) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def test_flower_is_healthy_only_when_it_asks_for_credentials() -> None:
    with _answering(401) as port:
        assert _check("--role", "flower", "--flower-port", str(port))[0] == 0
    with _answering(200) as port:  # something else on the port, not Flower behind its auth
        assert _check("--role", "flower", "--flower-port", str(port))[0] == 1
    assert _check("--role", "flower", "--flower-port", str(free_port()))[0] == 1


def test_the_web_role_is_healthy_when_its_own_readyz_answers() -> None:
    config = settings.CONFIG
    try:
        settings.CONFIG = dataclasses.replace(config, web_port=free_port())
        code, out = _check("--role", "web")
        assert code == 1 and "web fail" in out
        with web_process("web-health") as url:
            settings.CONFIG = dataclasses.replace(config, web_port=int(url.rsplit(":", 1)[1]))
            code, out = _check("--role", "web")
        assert code == 0, out
    finally:
        settings.CONFIG = config
