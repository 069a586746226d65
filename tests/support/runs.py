"""Rows seeded for recovery tests (runs in states a crash leaves behind), and the leader's due
loop for tests that need delayed starts released."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection, connections

from orchestrator.models import TaskHistory
from orchestrator.runs import children, due
from orchestrator.runs.start import new_run_id
from orchestrator.stores import durable, keys, live, valkey


def seed_orphan(heartbeat_age_s: int) -> str:
    """An active run whose worker is gone, last heartbeat `heartbeat_age_s` ago (Postgres clock),
    on its last attempt (test-noop's third), so the reconciler fails it rather than putting it
    back for another attempt (`orchestrator.runs.put_back`)."""
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id,
        task_id="test-noop",
        state="active",
        trigger={"kind": "manual"},
        input={},
        priority=5,
        identity=run_id,
        owner_instance_id="gone-host:1:X",
        attempts=3,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE task_history SET heartbeat_at = now() - %s * interval '1 second', "
            "started_at = now() - interval '1 hour' WHERE id = %s",
            [heartbeat_age_s, run_id],
        )
    return run_id


def seed_active(owner: str, task_id: str = "test-noop") -> str:
    """A run claimed by `owner` in both stores, as the runner leaves it before its terminal
    write."""
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id,
        task_id=task_id,
        trigger={"kind": "manual"},
        input={},
        priority=5,
        identity=run_id,
    )
    live.seed(run_id, task_id, 5, ())
    live.claim(run_id, owner, live.NO_PAUSE)
    assert durable.claim(run_id, owner) is not None
    return run_id


def clean_drain(cluster_seat: str) -> None:
    """No drain entries (pending, in flight, poisoned, backing off, failure counts) and no
    cluster leader left from an earlier test: the drain starts empty."""
    valkey.client().delete(
        keys.orchestrator_lock(cluster_seat),
        keys.drain_pending(),
        keys.drain_inflight(),
        keys.drain_poison(),
        keys.drain_backoff(),
        keys.drain_failures(),
    )


def clear_scheduler_locks() -> None:
    """Drop every schedule bucket lock an earlier test left (they run out after 30 s)."""
    client = valkey.client()
    stale = list(client.scan_iter(match=keys.scheduler_lock("*", "*"), count=500))
    if stale:
        client.delete(*stale)


@contextmanager
def due_loop() -> Iterator[None]:
    """The leader's `due` loop, as `orchestrator.loops` runs it, every 0.1 s."""
    with leader_loop(due.release):
        yield


@contextmanager
def batches_loop() -> Iterator[None]:
    """The leader's `batches` loop (`runs.children.release_when_done`), as the loops run it."""
    with leader_loop(lambda: children.release_when_done(wait_s=0.25)):
        yield


@contextmanager
def leader_loop(tick: Callable[[], object]) -> Iterator[None]:
    """One of the leader's loops in a thread of the test process, every 0.1 s."""
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.wait(0.1):
                tick()
        finally:
            connections.close_all()

    looping = threading.Thread(target=loop, daemon=True)
    looping.start()
    try:
        yield
    finally:
        stop.set()
        looping.join(5)
