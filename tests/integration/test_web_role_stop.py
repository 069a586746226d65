"""The web role stops as a deploy or Ctrl+C asks: `deploy/start-web.sh` (uvicorn) on SIGTERM or
SIGINT shuts down gracefully and exits 0, without a traceback (uvicorn raises the signal again
once it is done, which ended the process by it: 143), also while an operator's page holds a
stream open (uvicorn would wait for it to end, which it never does). The worker role's stops
are in test_worker_shutdown.py, `make run`'s in test_procfile_shutdown.py."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

import pytest

from lumastra.workers import kill_tree
from orchestrator.api import tokens
from tests.support.fixtures import ROOT, database_url, wait_for
from tests.support.servers import free_port, http_status
from tests.support.users import operator

pytestmark = pytest.mark.django_db(transaction=True)

STOP_S = 10


@dataclass
class Web:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, signum: int) -> float:
        """Sends `signum`; returns how long the role took to exit."""
        began = time.monotonic()
        self.process.send_signal(signum)
        try:
            self.process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the web role still runs {STOP_S}s after the signal") from None
        return time.monotonic() - began


@contextmanager
def _web_role(name: str) -> Iterator[Web]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "LUMASTRA_WEB_HOST": "127.0.0.1",
        "LUMASTRA_WEB_PORT": str(port),
    }
    log = ROOT / f".pytest_cache/web-{name}-{os.getpid()}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(ROOT / "deploy/start-web.sh")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    web = Web(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 60
        while http_status(f"{web.url}/healthz") != 200:
            assert process.poll() is None and time.monotonic() < deadline, f"see {log}"
            time.sleep(0.2)
        yield web
    finally:
        if process.poll() is None:
            kill_tree(process.pid)
            process.wait()


def _stopped_cleanly(web: Web, took: float) -> None:
    said = web.log.read_text(errors="replace")
    assert web.process.returncode == 0, said[-2000:]
    assert took < STOP_S
    assert "Finished server process" in said
    assert "Traceback" not in said
    assert http_status(f"{web.url}/healthz") is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_the_web_role_exits_0_when_asked_to_stop(signum: int) -> None:
    with _web_role(f"stop-{signum}") as web:
        took = web.stop(signum)

    _stopped_cleanly(web, took)


def test_the_web_role_stops_while_a_page_follows_the_events() -> None:
    token = tokens.issue(operator(), "stop test")[1]
    with _web_role("stop-streaming") as web:
        request = urllib.request.Request(
            f"{web.url}/api/v1/events", headers={"Authorization": f"Bearer {token}"}
        )
        stream = urllib.request.urlopen(request, timeout=STOP_S)
        assert stream.status == 200
        ended = threading.Event()

        def follow() -> None:
            # Until the server ends the stream: cut mid-chunk, as for a server that went away.
            with suppress(OSError, HTTPException):
                stream.read()
            ended.set()

        threading.Thread(target=follow, daemon=True).start()

        took = web.stop(signal.SIGTERM)

        wait_for(ended.is_set, 5)
    stream.close()
    _stopped_cleanly(web, took)
