"""Flower answers nobody without credentials and no host but the configured ones (issue #15).

Flower itself leaves `/metrics`, `/healthcheck` and its static files open even with
`--basic-auth`; `lumastra.flower` is what `make run` and compose start, so it is what runs
here: a real Flower subprocess on a free port, against the test broker.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.fixtures import ROOT
from tests.support.servers import free_port, http_status, serving

USER, PASSWORD = "flower-test", "s3cret-for-tests"
PATHS = ["/", "/metrics", "/healthcheck", "/api/workers", "/static/css/flower.css", "/nope"]


def _status(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> int:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture(scope="module")
def flower_url() -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "FLOWER_BASIC_AUTH": f"someone:else,{USER}:{PASSWORD}",
        "LUMASTRA_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    argv = [sys.executable, "-m", "lumastra.flower", "--address=127.0.0.1", f"--port={port}"]
    url = f"http://127.0.0.1:{port}"
    with serving(argv, env, "flower", lambda: http_status(f"{url}/healthcheck") is not None):
        yield url


@pytest.mark.parametrize("path", PATHS)
def test_every_path_refuses_a_request_without_credentials(flower_url: str, path: str) -> None:
    assert _status(flower_url + path) == 401


@pytest.mark.parametrize("path", PATHS)
def test_wrong_credentials_are_refused(flower_url: str, path: str) -> None:
    assert _status(flower_url + path, _basic(USER, "wrong")) == 401
    assert _status(flower_url + path, {"Authorization": "Basic !!not-base64"}) == 401


def test_a_write_without_credentials_is_refused_too(flower_url: str) -> None:
    assert _status(f"{flower_url}/api/task/revoke/some-id", method="POST") == 401


@pytest.mark.parametrize("path", ["/", "/metrics", "/healthcheck", "/api/workers"])
def test_the_configured_credentials_are_let_in(flower_url: str, path: str) -> None:
    assert _status(flower_url + path, _basic(USER, PASSWORD)) == 200


def test_another_host_is_refused_even_with_credentials(flower_url: str) -> None:
    headers = {**_basic(USER, PASSWORD), "Host": "attacker.example"}

    assert _status(f"{flower_url}/metrics", headers) == 400
    # A configured name with another port is the same host.
    assert _status(f"{flower_url}/metrics", {**headers, "Host": "localhost:9999"}) == 200


def test_flower_does_not_start_without_credentials() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}

    result = subprocess.run(
        [sys.executable, "-m", "lumastra.flower", "--port=1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "FLOWER_BASIC_AUTH is not set" in result.stderr
