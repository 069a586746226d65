"""`make run` on a new machine: `manage.py migrate` on an empty database succeeds (the
database checks it runs first must not need the tables it is about to create)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from django.conf import settings

from tests.support.fixtures import ROOT


@pytest.fixture
def empty_database() -> Iterator[str]:
    db = settings.DATABASES["default"]
    server = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}"
    name = f"lumastra_fresh_{uuid.uuid4().hex[:8]}"
    _admin(server, f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        _admin(server, f'DROP DATABASE "{name}" WITH (FORCE)')


def _admin(server: str, statement: str) -> None:
    connection = psycopg2.connect(f"{server}/postgres")
    connection.autocommit = True  # CREATE/DROP DATABASE refuse to run in a transaction
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement)
    finally:
        connection.close()


def test_migrate_on_an_empty_database_succeeds_and_the_checks_pass_after(
    empty_database: str,
) -> None:
    env = {**os.environ, "DATABASE_URL": empty_database}

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    migrated = manage("migrate", "--noinput")
    checked = manage("check", "--database", "default")

    assert migrated.returncode == 0, migrated.stderr[-2000:]
    assert checked.returncode == 0, checked.stderr[-2000:]
