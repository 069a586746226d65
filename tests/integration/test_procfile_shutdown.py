"""`make run` on one machine: honcho runs every role of deploy/Procfile (web, worker, beat,
Flower); Ctrl+C (SIGINT to the process group) or a SIGTERM to honcho ends every process any of
them started, so nothing is left holding a port or taking messages. honcho sends SIGTERM to
each role's process group and SIGKILL to what is left 5 s after the first role stopped: idle,
every role stops before that."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from lumastra.workers import descendants, kill_tree
from tests.support.fixtures import ROOT, database_url
from tests.support.processes import ONE_PROCESS_PER_POOL, alive
from tests.support.servers import free_port, http_status

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LOG = ROOT / f".pytest_cache/procfile-{os.getpid()}.log"


@contextmanager
def _every_role(web_port: int, flower_port: int) -> Iterator[subprocess.Popen[bytes]]:
    venv_bin = ROOT / ".venv" / "bin"
    env = {
        **os.environ,
        **ONE_PROCESS_PER_POOL,
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
        "DATABASE_URL": database_url(),
        "LUMASTRA_SECRET_KEY": os.environ.get("LUMASTRA_SECRET_KEY", "test-" + "x" * 50),
        "LUMASTRA_WEB_PORT": str(web_port),
        "FLOWER_PORT": str(flower_port),
        "FLOWER_BASIC_AUTH": "ops:ops-password",
        "LUMASTRA_SHUTDOWN_GRACE_S": "2",
    }
    log = LOG.open("wb")
    process = subprocess.Popen(
        [str(venv_bin / "honcho"), "-d", str(ROOT), "-f", "deploy/Procfile", "start"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's would be
    )
    try:
        yield process
    finally:
        kill_tree(process.pid)
        process.wait()
        log.close()


def _up(process: subprocess.Popen[bytes], web_port: int, flower_port: int) -> list[int]:
    """Waits until the web role and Flower answer and the worker role has its pools."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, "honcho exited: a role failed to start"
        web = http_status(f"http://127.0.0.1:{web_port}/healthz")
        flower = http_status(f"http://127.0.0.1:{flower_port}/")
        tree = descendants(process.pid)
        if web == 200 and flower is not None and len(tree) >= 10:
            time.sleep(2)  # the pools' children
            return descendants(process.pid)
        time.sleep(0.5)
    raise TimeoutError("the roles did not come up")


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_stopping_make_runs_roles_leaves_no_process_behind(stop: str) -> None:
    web_port, flower_port = free_port(), free_port()
    with _every_role(web_port, flower_port) as honcho:
        tree = _up(honcho, web_port, flower_port)

        if stop == "ctrl-c":
            os.killpg(honcho.pid, signal.SIGINT)  # what a terminal sends on Ctrl+C
        else:
            honcho.send_signal(signal.SIGTERM)
        honcho.wait(timeout=60)

        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [pid for pid in tree if alive(pid)] == []
        assert http_status(f"http://127.0.0.1:{web_port}/healthz") is None
        said = LOG.read_text(errors="replace")
        assert "sending SIGTERM to worker" in said
        assert "SIGKILL" not in said, "a role did not stop within honcho's 5 s"
        # The roles' own status (the Procfile execs them), not a shell's ended by the signal.
        assert "web.1 stopped (rc=0)" in said
        assert "worker.1 stopped (rc=0)" in said
