"""Engine gaps the fault battery found, each reduced to one reconciler tick or one message on
real Postgres and Redis (docs/reliability.md, "What the battery found").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg2
import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from orchestrator.cluster.leaders import CLUSTER
from orchestrator.hooks import quotas
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.recovery.pending import PendingReport
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.runs.runner import run_message
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import broker, durable, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tests.support.messages import empty_queues

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

QUEUE = "task.t.test-fault-work"
TAG = "test-faults-stranded"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    client = broker.client()
    empty_queues(QUEUE)
    client.hdel(keys.BROKER_UNACKED, TAG)
    client.zrem(keys.BROKER_UNACKED_INDEX, TAG)
    valkey.client().delete(keys.orchestrator_lock(CLUSTER))
    yield


def _pending_taken_by_a_worker(taken_s_ago: float) -> str:
    """A pending run whose message a worker took `taken_s_ago` and never acknowledged, as
    kombu records it (off its list; in `unacked` and `unacked_index`), 90 s old in Postgres."""
    run_id = start_run("test-fault-work", {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    client = broker.client()
    for step in keys.BROKER_PRIORITY_STEPS:
        name = keys.broker_queue(QUEUE, step)
        for raw in client.lrange(name, 0, -1):
            client.lrem(name, 1, raw)
            client.hset(keys.BROKER_UNACKED, TAG, json.dumps([json.loads(raw), "", QUEUE]))
            client.zadd(keys.BROKER_UNACKED_INDEX, {TAG: time.time() - taken_s_ago})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE task_history SET created_at = now() - interval '90 seconds', "
            "updated_at = now() - interval '90 seconds' WHERE id = %s",
            [run_id],
        )
    return run_id


def _tick() -> PendingReport:
    reconciler = Reconciler()
    try:
        report = reconciler.tick()
    finally:
        reconciler.release()
    assert not report.skipped
    return report.pending


def _waiting() -> int:
    return broker.depth([QUEUE])


def test_a_message_a_worker_took_lately_counts_as_held() -> None:
    _pending_taken_by_a_worker(taken_s_ago=1)

    report = _tick()

    assert report.waiting == 1 and report.republished == 0
    assert _waiting() == 0


def test_a_message_stranded_in_unacked_is_published_again() -> None:
    """Its worker died after taking it (or the ack was lost in a Valkey restart): kombu would
    give it back after the visibility timeout (1 h by default) plus its restore cadence."""
    run_id = _pending_taken_by_a_worker(taken_s_ago=600)

    report = _tick()

    assert report.republished == 1
    assert _waiting() == 1
    assert TaskHistory.objects.get(id=run_id).state == "pending"


def test_a_claim_that_reached_valkey_only_does_not_strand_the_run() -> None:
    run_id = start_run("test-fault-work", {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    # What a worker on another host leaves behind when it died after claim_run.lua and before
    # Postgres heard of its claim (a short run's claim is folded into its end; or the reply of
    # the Lua call was lost): the hash says active, owned by a process that no longer runs it;
    # Postgres says pending; the message was acknowledged.
    owner = "elsewhere:1:DEADBEEF"
    live.claim(run_id, owner, live.NO_PAUSE)
    empty_queues(QUEUE)
    run_message("test-fault-work", run_id, 1)  # a delivery racing a live claimer: refused
    assert TaskHistory.objects.get(id=run_id).state == "pending"
    # The reconciler re-publishes only after its pending delay; by then the claim is old, and
    # its owner has been silent for longer than the orphan threshold.
    silent_ms = int(live.read(run_id)["started_at"]) - 400_000
    valkey.client().hset(
        keys.run_active(run_id), mapping={"started_at": silent_ms, "updated_at": silent_ms}
    )

    run_message("test-fault-work", run_id, 1)  # the reconciler's re-published message

    # Its claim is written for it, as of its last sign of life: the lost attempt counts, and
    # the run is an orphan the reconciler resumes; its next attempt completes.
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id, row.attempts) == ("active", owner, 1)
    _tick()
    assert TaskHistory.objects.get(id=run_id).state == "pending"
    TaskHistory.objects.filter(id=run_id).update(not_before=None)  # its backoff has passed
    run_message("test-fault-work", run_id, 1)
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts) == ("completed", 2)


def test_a_live_hash_left_behind_a_terminal_write_is_repaired() -> None:
    run_id = start_run("test-fault-work", {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    owner = "elsewhere:1:DEADBEEF"
    live.claim(run_id, owner, live.NO_PAUSE)
    # The worker wrote Postgres (claim, then the end) and was SIGKILLed before it settled the run,
    # longer ago than the repair's grace for writers still at work.
    durable.claim(run_id, owner)
    ended_at = timezone.now() - timedelta(seconds=30)
    durable.end(run_id, RunState.COMPLETED, finished_at=ended_at, owner=owner)

    _tick()

    assert live.read(run_id)["state"] == "completed"
    # The finished hooks ran once the hash was repaired (the quota counts the completion).
    quotas.rollup()
    usage = TaskQuotaUsage.objects.get(task_id="test-fault-work")
    assert usage.completed == 1


def test_a_claim_postgres_refused_is_given_back_in_valkey() -> None:
    """pg_terminate_backend (or a Postgres outage) between the Valkey claim and the Postgres
    half (its read of the run): the Valkey claim is given back, so the re-published run can
    still be claimed."""
    run_id = start_run("test-fault-work", {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    other = psycopg2.connect(**_dsn())
    try:
        with other.cursor() as cursor:  # holds the table: the claim's read waits on it
            cursor.execute("LOCK TABLE task_history IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = '300ms'")
        with pytest.raises(OperationalError):
            run_message("test-fault-work", run_id, 1)
    finally:
        other.rollback()
        other.close()
        connection.close()

    assert TaskHistory.objects.get(id=run_id).state == "pending"
    assert live.read(run_id)["state"] == "pending"
    run_message("test-fault-work", run_id, 1)
    assert TaskHistory.objects.get(id=run_id).state == "completed"


def _dsn() -> dict[str, object]:
    db = connection.settings_dict
    return {"dbname": db["NAME"], "user": db["USER"], "host": db["HOST"], "port": db["PORT"]}
