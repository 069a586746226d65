"""Pytest plugin: real Celery worker subprocesses against the test database and Redis DBs."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, current_app
from django.conf import settings
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.files.storage import storages
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.utils.functional import empty
from redis.exceptions import RedisError

from lumastra.workers import worker_argv
from orchestrator.routing import queue_name
from orchestrator.stores import keys, valkey
from tasks import registry
from tests.support.processes import stop

ROOT = Path(__file__).resolve().parents[2]
# The tasks the shared worker runs. Every other task's queue is taken only by a test's own
# worker, which then controls when its messages are taken (a new task stays private until it
# is listed here: a shared worker racing a test's own is how flaky tests start).
SHARED_TASKS = (
    "hash-folder",
    "history-retention",
    "slow-progress",
    "test-circuit",
    "test-fail",
    "test-noop",
    "test-quota",
    "test-versioned",
)


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
    """A real `celery worker` subprocess consuming `queues`; waits until it answers a ping
    (through the broker `env` names, if it names one). `env` adds variables, e.g. compressed
    thresholds for watchdog tests."""
    hostname = f"{name}-{os.getpid()}-{time.monotonic_ns()}@localhost"
    broker = (env or {}).get("CELERY_BROKER_URL")
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
        # Celery's control publishes through its app's own producers, whatever connection it
        # is given, and CELERY_BROKER_URL in the environment outranks an app's `broker`: a
        # worker on another broker is pinged through an app configured as ours (its priority
        # steps name the reply lists) whose write URL is that broker.
        pinger = current_app
        if broker:
            pinger = Celery(set_as_current=False)
            pinger.config_from_object("django.conf:settings", namespace="CELERY")
            pinger.conf.broker_write_url = broker
        try:
            while not pinger.control.ping(destination=[hostname], timeout=0.5):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {hostname} did not start; see {log.name}")
        finally:
            if pinger is not current_app:
                pinger.close()
        yield process
    finally:
        stop(process)
        log.close()


def stall_fail_everywhere(seconds: int) -> dict[str, str]:
    """The environment that sets every resource class's stall limit (warned at a fifth)."""
    from tasks.resources import RESOURCE_CLASSES

    return {f"LUMASTRA_STALL_FAIL_S_{name.upper()}": str(seconds) for name in RESOURCE_CLASSES}


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


@pytest.fixture(scope="session", autouse=True)
def _static_files() -> None:
    """The pages name their static files by hashed names from collectstatic's manifest (the
    storage the image and `make run` use): collect them once when any source is newer than the
    manifest. Locked, since the fault battery's session starts beside the rest."""
    manifest = Path(settings.STATIC_ROOT) / "staticfiles.json"
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)
    with open(ROOT / ".pytest_cache" / "collectstatic.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sources = (
            Path(storage.path(path)).stat().st_mtime
            for finder in finders.get_finders()
            for path, storage in finder.list([])
        )
        if not manifest.exists() or max(sources) > manifest.stat().st_mtime:
            call_command("collectstatic", interactive=False, verbosity=0)
    # The storage reads its manifest once, when first used: one used before the manifest was
    # whole (a clean clone's first session, the battery's beside it) reads it again now.
    storages._storages.pop("staticfiles", None)
    staticfiles_storage._wrapped = empty


@pytest.fixture(scope="session", autouse=True)
def _clean_redis() -> None:
    """Tests own Redis DBs 13 to 15 (pyproject); start each session from empty ones."""
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)
    valkey.client().flushdb()
    with current_app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()


@pytest.fixture(autouse=True)
def _fresh_counters() -> None:
    """Circuits, refusal and daily run counts, failed sign-ins and accepted trigger signatures
    outlive a test's database; each test starts without them, so failures one test provokes
    never refuse another test's starts, tokens or signed requests, and runs one test counts
    never show in another's figures. Nor the pauses' mirror: a pause or a closed run window
    one test leaves behind (its rows go with its database) holds no other test's runs."""
    client = valkey.client()
    client.delete(keys.pauses())
    patterns = (
        keys.circuit("*"),
        keys.refusals("*", "*"),
        keys.quota_counts("*", "*"),
        keys.cost_day("*", "*"),
        keys.auth_failures("*"),
        keys.trigger_signature("*", "*"),
    )
    for pattern in patterns:
        stale = list(client.scan_iter(match=pattern, count=500))
        if stale:
            client.delete(*stale)


@pytest.fixture(scope="session")
def celery_worker(
    django_db_setup: None, django_db_blocker: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """One shared worker for the queues of SHARED_TASKS."""
    with django_db_blocker.unblock():
        connection.ensure_connection()
    with worker_process(_shared_queues(), concurrency=2, name="shared") as process:
        _shared_worker.append(process)
        yield process
        _shared_worker.clear()


_shared_worker: list[subprocess.Popen[bytes]] = []
# A test's runs of shared tasks that are still in flight at its end finish within this.
SHARED_IDLE_TIMEOUT_S = 10.0


def _shared_queues() -> list[str]:
    tasks = registry.get()
    return sorted({queue_name(tasks[t], settings.CONFIG.per_task_queues) for t in SHARED_TASKS})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before a database test's tables are flushed, let the shared worker finish the runs the
    test left in flight: its writes racing the flush's TRUNCATE deadlock (seen in CI)."""
    if _shared_worker and item.get_closest_marker("django_db"):
        # A test that pointed a store elsewhere, or took it down (its fixtures restore it after
        # this), has nothing of the shared worker's to wait for there.
        with suppress(RedisError, DatabaseError):
            _wait_for_shared_worker_idle()
    yield


def _wait_for_shared_worker_idle() -> None:
    """Idle: nothing waiting in the shared queues and nothing taken and not acknowledged. A run
    the worker runs holds its message unacknowledged until its end is written (acks_late), so
    rows a test seeded as active (the reconciler's, say) do not keep this waiting."""
    from orchestrator.stores import broker

    queues = _shared_queues()
    deadline = time.monotonic() + SHARED_IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        if broker.depth(queues) == 0 and not _taken_not_done(queues):
            return
        time.sleep(0.05)


def _taken_not_done(queues: list[str]) -> bool:
    """A message of the shared queues the worker has taken and not acknowledged, other than a
    retry it holds until its countdown: its run may not be claimed yet (still `pending`, off
    the broker's lists), and its claim would race the flush."""
    from orchestrator.stores import broker, keys

    for entry in broker.client().hvals(keys.BROKER_UNACKED):
        message, _exchange, routing_key = json.loads(entry)
        if routing_key in queues and not message.get("headers", {}).get("eta"):
            return True
    return False
