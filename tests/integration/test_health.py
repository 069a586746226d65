"""Health probes: /healthz, /readyz and `manage.py healthcheck [--ready]` with a dependency down.

A store is "down" honestly: a URL on a port where nothing listens, a redis-server this test
started and then kills, a migration recorded as not applied (rolled back with the test).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client

from tests.faults.servers import ValkeyServer
from tests.support.fixtures import ROOT, database_url
from tests.support.servers import free_port, web_process

ALL_OK = {"postgres": "ok", "migrations": "ok", "valkey": "ok", "broker": "ok"}


def _nowhere() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


def _get(url: str, host: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


# --- in the test process ----------------------------------------------------------------


@pytest.mark.django_db
def test_healthz_is_ok_without_credentials_and_from_any_host() -> None:
    response = Client().get("/healthz", HTTP_HOST="10.1.2.3:8000")

    assert response.status_code == 200
    assert response.content == b"ok"


@pytest.mark.django_db
def test_readyz_is_200_when_every_dependency_answers() -> None:
    response = Client().get("/readyz", HTTP_HOST="10.1.2.3:8000")

    assert response.status_code == 200
    assert response.json() == ALL_OK
    assert response["Cache-Control"] == "no-store"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "name"), [("valkey_url", "valkey"), ("celery_broker_url", "broker")]
)
def test_readyz_is_503_naming_the_store_that_does_not_answer(
    settings: LazySettings, field: str, name: str
) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, **{field: _nowhere()})

    response = Client().get("/readyz")

    assert response.status_code == 503
    assert response.json() == {**ALL_OK, name: "fail"}


@pytest.mark.django_db
def test_readyz_is_503_while_a_migration_is_not_applied() -> None:
    latest = MigrationRecorder.Migration.objects.filter(app="orchestrator").latest("id")
    # Rolled back with the test's transaction: the database is as if it never ran.
    MigrationRecorder(connection).record_unapplied(latest.app, latest.name)

    response = Client().get("/readyz")

    assert response.status_code == 503
    assert response.json() == {**ALL_OK, "migrations": "fail"}


def test_the_body_says_nothing_beyond_ok_or_fail(settings: LazySettings, db: None) -> None:
    settings.CONFIG = dataclasses.replace(
        settings.CONFIG, valkey_url="redis://:secret-password@127.0.0.1:1/0"
    )

    body = Client().get("/readyz").content.decode()

    assert set(json.loads(body).values()) <= {"ok", "fail"}
    assert "secret" not in body and "127.0.0.1" not in body


# --- the management command, as a container health check runs it -------------------------


def _healthcheck(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "healthcheck", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _lines(output: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in output.splitlines())


@pytest.mark.django_db
def test_healthcheck_without_ready_only_loads_the_project() -> None:
    done = _healthcheck(VALKEY_URL=_nowhere())

    assert (done.returncode, done.stdout.strip()) == (0, "ok")


@pytest.mark.django_db(transaction=True)
def test_healthcheck_ready_exits_0_when_every_dependency_answers() -> None:
    done = _healthcheck("--ready")

    assert done.returncode == 0, done.stderr
    assert _lines(done.stdout) == ALL_OK


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("env", "down"),
    [
        ({"VALKEY_URL": "nowhere"}, {"valkey"}),
        ({"CELERY_BROKER_URL": "nowhere"}, {"broker"}),
        ({"DATABASE_URL": "postgres://postgres@127.0.0.1:{port}/x"}, {"postgres", "migrations"}),
    ],
)
def test_healthcheck_ready_exits_1_naming_what_is_down(env: dict[str, str], down: set[str]) -> None:
    port = free_port()
    env = {k: _nowhere() if v == "nowhere" else v.format(port=port) for k, v in env.items()}

    done = _healthcheck("--ready", **env)

    assert done.returncode == 1
    assert _lines(done.stdout) == {k: "fail" if k in down else "ok" for k in ALL_OK}


# --- the web role, with a Valkey this test starts and stops -------------------------------


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[ValkeyServer]:
    server = ValkeyServer(aof=False, log_path=tmp_path / "valkey.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_web_role_readyz_follows_its_valkey_down_and_up(own_valkey: ValkeyServer) -> None:
    with web_process("web-health", VALKEY_URL=own_valkey.url(0)) as url:
        assert _get(f"{url}/readyz", host="web-1.internal") == (200, json.dumps(ALL_OK).encode())

        own_valkey.crash()
        status, body = _get(f"{url}/readyz", host="web-1.internal")
        assert status == 503
        assert json.loads(body) == {**ALL_OK, "valkey": "fail"}
        # Liveness reads no store: a Valkey outage must not get the replica restarted.
        assert _get(f"{url}/healthz") == (200, b"ok")

        own_valkey.start()
        assert _get(f"{url}/readyz")[0] == 200
