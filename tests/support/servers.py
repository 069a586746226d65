"""Test servers as real subprocesses: the web role and Flower, each on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.fixtures import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_status(url: str) -> int | None:
    """The status `url` answers a GET with (an error status too), None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


@contextmanager
def serving(
    argv: Sequence[str], env: Mapping[str, str], name: str, ready: Callable[[], bool]
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` in its own process group (teardown also ends what it started), its output in
    .pytest_cache/<name>-<pid>.log; yields once `ready()` holds, within 60 s."""
    log = ROOT / f".pytest_cache/{name}-{os.getpid()}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=dict(env),
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {log}")
            time.sleep(0.2)
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def web_process(name: str, **env: str) -> Iterator[str]:
    """`deploy/start-web.sh` on a free port, on the test database, with `env` added; yields
    its base URL once it serves the admin's login page."""
    from tests.support.fixtures import database_url

    port = free_port()
    full_env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DATABASE_URL": database_url(),
        "LUMASTRA_WEB_HOST": "127.0.0.1",
        "LUMASTRA_WEB_PORT": str(port),
        **env,
    }
    url = f"http://127.0.0.1:{port}"
    with serving(
        [str(ROOT / "deploy/start-web.sh")],
        full_env,
        name,
        lambda: http_status(f"{url}/admin/login/") == 200,
    ):
        yield url
