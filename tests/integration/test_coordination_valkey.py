"""Every role refuses, at start, a coordination Valkey that may evict keys or keeps nothing on
disk (`lumastra.preflight.check_coordination_valkey`), unless LUMASTRA_ALLOW_VOLATILE_VALKEY
says this machine's Valkey may lose what it holds. Each test starts its own redis-server."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lumastra.preflight import check_coordination_valkey
from tests.support.fixtures import ROOT
from tests.support.servers import free_port

SAFE = ("--maxmemory-policy", "noeviction", "--appendonly", "yes")
EVICTING = ("--maxmemory-policy", "allkeys-lru", "--appendonly", "yes")
VOLATILE = ("--maxmemory-policy", "noeviction", "--appendonly", "no", "--save", "")
SCRIPTS = ("start-web.sh", "start-worker.sh", "start-beat.sh", "start-flower.sh")


def _server(tmp_path: Path, *settings: str) -> Iterator[str]:
    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    assert binary, "these tests need redis-server (or valkey-server) on PATH"
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), *settings]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert process.poll() is None, f"redis-server {settings} did not start"
                assert time.monotonic() < deadline, "redis-server did not answer in 10 s"
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[str]:
    yield from _server(tmp_path, *EVICTING)


@pytest.fixture
def volatile(tmp_path: Path) -> Iterator[str]:
    yield from _server(tmp_path, *VOLATILE)


@pytest.fixture
def safe(tmp_path: Path) -> Iterator[str]:
    yield from _server(tmp_path, *SAFE)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_role_refuses_an_evicting_coordination_valkey(script: str, evicting: str) -> None:
    env = {
        **os.environ,
        "VALKEY_URL": evicting,
        "LUMASTRA_ALLOW_VOLATILE_VALKEY": "false",
        "FLOWER_BASIC_AUTH": "someone:something",
    }

    ran = subprocess.run(
        [str(ROOT / "deploy" / script)], env=env, capture_output=True, text=True, timeout=60
    )

    assert ran.returncode == 1
    assert "may evict keys (maxmemory-policy allkeys-lru)" in ran.stderr
    assert "LUMASTRA_ALLOW_VOLATILE_VALKEY=true" in ran.stderr


def test_a_coordination_valkey_that_keeps_nothing_on_disk_is_refused(volatile: str) -> None:
    problems, warnings = check_coordination_valkey(volatile, allow_volatile=False)

    assert len(problems) == 1 and not warnings
    assert "keeps nothing on disk" in problems[0]


def test_a_noeviction_persistent_coordination_valkey_passes(safe: str) -> None:
    assert check_coordination_valkey(safe, allow_volatile=False) == ([], [])


def test_the_override_lets_a_volatile_valkey_pass_with_a_warning(volatile: str) -> None:
    problems, warnings = check_coordination_valkey(volatile, allow_volatile=True)

    assert problems == []
    assert len(warnings) == 1 and "keeps nothing on disk" in warnings[0]


def test_a_valkey_that_hides_its_settings_is_a_warning(tmp_path: Path) -> None:
    for url in _server(tmp_path, *SAFE, "--rename-command", "CONFIG", ""):
        problems, warnings = check_coordination_valkey(url, allow_volatile=False)

        assert problems == []
        assert "does not show its settings" in warnings[0]


def test_an_unreachable_valkey_is_a_warning_the_role_retries_on_its_own() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"

    problems, warnings = check_coordination_valkey(url, allow_volatile=False)

    assert problems == []
    assert "not reachable yet" in warnings[0]
