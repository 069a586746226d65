"""Pytest plugin: real Celery worker subprocesses against the test database and Redis DBs."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import current_app
from django.conf import settings
from django.db import connection

from lumastra.workers import worker_argv
from orchestrator.routing import queue_name
from orchestrator.stores import keys, valkey
from tasks import registry

ROOT = Path(__file__).resolve().parents[2]
# Queues only a test's own worker consumes, so it controls when their messages are taken.
PRIVATE_QUEUES = {
    # Fired by schedule tests that end while the shared worker would still be running them:
    # its writes would race the test database flush (a deadlock was seen in CI).
    "task.t.epg-refresh",
    "task.t.test-record-order",
    "task.t.test-unique",
    "task.t.test-excl-a",
    "task.t.test-excl-b",
    "task.t.test-unique-quota",
    "task.t.test-limited",
    "task.t.test-lease",
    "task.t.test-rated",
    "task.t.test-bp-drop",
    "task.t.test-bp-fail",
    "task.t.test-bp-shed",
    "task.t.test-quota-drop",
    "task.t.test-sleepy",
    "task.t.test-hard-timeout",
    "task.t.test-flaky",
    # The fault battery's (tests/faults): only its own workers take them.
    "task.t.test-fault-work",
    "task.t.test-fault-poison",
    "task.t.test-fault-crash",
    "task.t.test-fault-limited",
}


def database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@contextmanager
def worker_process(
    queues: Sequence[str],
    concurrency: int = 2,
    name: str = "test",
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A real `celery worker` subprocess consuming `queues`; waits until it answers a ping.
    `env` adds variables, e.g. compressed thresholds for watchdog tests."""
    hostname = f"{name}-{os.getpid()}-{time.monotonic_ns()}@localhost"
    env = {**os.environ, "DATABASE_URL": database_url(), **(env or {})}
    log = open(ROOT / f".pytest_cache/worker-{name}-{os.getpid()}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        worker_argv(
            hostname,
            concurrency,
            queues,
            ["--without-mingle", "--without-gossip", "--loglevel=INFO"],
        ),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not current_app.control.ping(destination=[hostname], timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {hostname} did not start; see {log.name}")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


@pytest.fixture(scope="session", autouse=True)
def _clean_redis() -> None:
    """Tests own Redis DBs 13 to 15 (pyproject); start each session from empty ones."""
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)
    valkey.client().flushdb()
    with current_app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()


@pytest.fixture(autouse=True)
def _fresh_counters() -> None:
    """Circuits and refusal counts outlive a test's database; each test starts without them,
    so failures one test provokes never refuse another test's starts."""
    client = valkey.client()
    for pattern in (keys.circuit("*"), keys.refusals("*", "*")):
        stale = list(client.scan_iter(match=pattern, count=500))
        if stale:
            client.delete(*stale)


@pytest.fixture(scope="session")
def celery_worker(
    django_db_setup: None, django_db_blocker: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """One shared worker for every public test queue."""
    queues = sorted(
        {queue_name(d, settings.CONFIG.per_task_queues) for d in registry.get().values()}
        - PRIVATE_QUEUES
    )
    with django_db_blocker.unblock():
        connection.ensure_connection()
    with worker_process(queues, concurrency=2, name="shared") as process:
        yield process
