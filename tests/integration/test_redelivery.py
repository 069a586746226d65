"""A redelivered message of a live run: dropped while its owner lives, the run ended as
worker_lost when its owner is dead or silent, and given up after too many redeliveries.

The runner is called in this process, as a worker's pool child would call it for a message
kombu restored (`redelivered`)."""

from __future__ import annotations

import socket
import subprocess

import pytest
from django.db import connection
from django.db.models.functions import Now

from orchestrator.cluster.instance import instance_id
from orchestrator.models import TaskHistory
from orchestrator.runs.runner import run_message
from orchestrator.runs.start import start_run
from orchestrator.stores import live
from orchestrator.triggers import TriggerKind

pytestmark = [pytest.mark.django_db(transaction=True)]


def _active(owner: str) -> str:
    run_id = start_run("test-sleepy", {"seconds": 1}, trigger=TriggerKind.MANUAL).run_id
    live.claim(run_id, owner)
    TaskHistory.objects.filter(id=run_id).update(
        state="active", owner_instance_id=owner, started_at=Now(), heartbeat_at=Now(), attempts=1
    )
    return run_id


def _dead_owner() -> str:
    """An instance id of this host whose process has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return f"{socket.gethostname()}:{process.pid}:deadbeef"


def test_a_redelivery_of_a_live_owners_run_is_dropped() -> None:
    run_id = _active(instance_id())

    run_message("test-sleepy", run_id, 1, redelivered=True)

    assert TaskHistory.objects.get(id=run_id).state == "active"
    assert live.read(run_id)["state"] == "active"


def test_a_redelivery_of_a_dead_owners_run_ends_it_as_worker_lost() -> None:
    run_id = _active(_dead_owner())

    run_message("test-sleepy", run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "failed" and row.error["kind"] == "worker_lost"
    assert live.read(run_id)["state"] == "failed"


def test_a_redelivery_with_a_stale_heartbeat_ends_the_run() -> None:
    run_id = _active("another-host:1234:abcdefgh")
    with connection.cursor() as cursor:  # aged by the Postgres clock, as the runner judges
        cursor.execute(
            "UPDATE task_history SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            [run_id],
        )

    run_message("test-sleepy", run_id, 1, redelivered=True)

    assert TaskHistory.objects.get(id=run_id).error["kind"] == "worker_lost"


def test_too_many_redeliveries_end_the_run() -> None:
    run_id = _active(instance_id())

    for _ in range(4):
        run_message("test-sleepy", run_id, 1, redelivered=True)
    assert TaskHistory.objects.get(id=run_id).state == "active"
    run_message("test-sleepy", run_id, 1, redelivered=True)

    row = TaskHistory.objects.get(id=run_id)
    assert row.state == "failed" and row.error["kind"] == "worker_lost"
    assert "redelivered 5 times" in row.error["message"]
