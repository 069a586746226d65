"""The web role stops as a deploy or Ctrl+C asks: `deploy/start-web.sh` (uvicorn) on SIGTERM or
SIGINT shuts down gracefully and exits 0, without a traceback (uvicorn raises the signal again
once it is done, which ended the process by it: 143). The worker role's stops are in
test_worker_shutdown.py, `make run`'s in test_procfile_shutdown.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from lumastra.workers import kill_tree
from tests.support.fixtures import ROOT, database_url
from tests.support.servers import free_port, http_status

pytestmark = pytest.mark.django_db(transaction=True)

STOP_S = 10


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_the_web_role_exits_0_when_asked_to_stop(signum: int) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "LUMASTRA_WEB_HOST": "127.0.0.1",
        "LUMASTRA_WEB_PORT": str(port),
    }
    log = ROOT / f".pytest_cache/web-stop-{signum}-{os.getpid()}.log"
    with log.open("wb") as out:
        web = subprocess.Popen(
            [str(ROOT / "deploy/start-web.sh")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{port}/healthz") != 200:
            assert web.poll() is None and time.monotonic() < deadline, f"no web role; see {log}"
            time.sleep(0.2)

        began = time.monotonic()
        web.send_signal(signum)
        web.wait(timeout=STOP_S)
        took = time.monotonic() - began
    finally:
        if web.poll() is None:
            kill_tree(web.pid)
            web.wait()

    said = log.read_text(errors="replace")
    assert web.returncode == 0, said[-2000:]
    assert took < STOP_S
    assert "Finished server process" in said
    assert "Traceback" not in said
    assert http_status(f"http://127.0.0.1:{port}/healthz") is None
