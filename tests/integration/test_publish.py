"""A run's message, published without Celery's producer: the same message `send_task` sends,
on a held broker connection that survives a broker restart, threads and a fork.

The messages go to the private queue of `test-record-order`, which no shared worker consumes,
and are read back from the broker's lists.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import current_app
from celery.signals import after_task_publish, before_task_publish
from django.conf import LazySettings
from django.conf import settings as django_settings
from django.db import transaction

from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs.publish import HOOK_HEADER, publish
from orchestrator.runs.start import new_run_id, start_run
from orchestrator.states import RunState
from orchestrator.stores import broker, keys
from orchestrator.stores.broker import job_id
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import TaskDefinition
from tests.faults.servers import ValkeyServer
from tests.support.fixtures import SHARED_TASKS
from tests.support.messages import empty_queues

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK_ID = "test-record-order"


@pytest.fixture
def definition() -> Iterator[TaskDefinition]:
    """The private task; its queue's lists are emptied before and after the test."""
    assert TASK_ID not in SHARED_TASKS
    found = registry.get()[TASK_ID]
    _empty(found)
    yield found
    _empty(found)


def _queue(definition: TaskDefinition) -> str:
    return queue_name(definition, django_settings.CONFIG.per_task_queues)


def _lists(definition: TaskDefinition) -> list[str]:
    return [keys.broker_queue(_queue(definition), step) for step in keys.BROKER_PRIORITY_STEPS]


def _empty(definition: TaskDefinition) -> None:
    empty_queues(_queue(definition))


def _waiting(definition: TaskDefinition) -> list[tuple[str, dict[str, Any]]]:
    """(list name, decoded message) for every message waiting in the task's queue."""
    client = broker.client()
    return [
        (name, json.loads(raw)) for name in _lists(definition) for raw in client.lrange(name, 0, -1)
    ]


def _comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A message without what differs between any two publishes: the delivery tag (random),
    the RPC reply address and origin (per publisher) and the eta's instant."""
    message = json.loads(json.dumps(message))
    message["body"] = json.loads(base64.b64decode(message["body"]))
    for field in ("delivery_tag", "reply_to"):
        message["properties"].pop(field)
    message["headers"].pop("origin")
    eta = message["headers"].pop("eta")
    message["headers"]["has_eta"] = eta is not None
    return message


# An admission's notes go as the custom header `send_task(headers=...)` sends, which Celery
# hands the task as `request.<header>`: the runner reads them there (`celery_tasks`).
@pytest.mark.parametrize(
    ("delay", "notes"),
    [(None, None), (timedelta(seconds=30), None), (None, {"circuit_probe": True})],
)
def test_the_message_is_the_one_send_task_sends(
    definition: TaskDefinition, delay: timedelta | None, notes: dict[str, bool] | None
) -> None:
    run_id = new_run_id()
    job = job_id(TASK_ID, "ident", run_id)
    queue = _queue(definition)

    publish(definition, run_id, job, 3, delay=delay, notes=notes)
    [(ours_list, ours)] = _waiting(definition)
    _empty(definition)
    current_app.send_task(
        TASK_ID,
        args=[run_id, definition.processing_version],
        task_id=job,
        queue=queue,
        priority=3,
        countdown=delay.total_seconds() if delay else None,
        headers={HOOK_HEADER: notes} if notes else None,
    )
    [(celerys_list, celerys)] = _waiting(definition)

    assert ours_list == celerys_list == keys.broker_queue(queue, 3)
    assert _comparable(ours) == _comparable(celerys)
    assert ours["headers"]["task"] == TASK_ID
    assert ours["headers"]["id"] == job
    assert ours["body"] != ""
    assert ours["headers"].get(HOOK_HEADER) == notes
    if delay is not None:
        ours_eta = datetime.fromisoformat(ours["headers"]["eta"])
        celerys_eta = datetime.fromisoformat(celerys["headers"]["eta"])
        assert abs(ours_eta - celerys_eta) < timedelta(seconds=5)


def test_publish_signals_are_sent_and_a_header_added_before_is_sent(
    definition: TaskDefinition,
) -> None:
    # Tracing and monitoring add headers and watch publishes through Celery's signals.
    seen: list[str] = []

    def tag(headers: dict[str, Any], **_: Any) -> None:
        headers["trace"] = "t-1"

    def watch(headers: dict[str, Any], **_: Any) -> None:
        seen.append(headers["id"])

    before_task_publish.connect(tag, weak=False)
    after_task_publish.connect(watch, weak=False)
    try:
        run_id = new_run_id()
        publish(definition, run_id, job_id(TASK_ID, "ident", run_id), 5)
    finally:
        before_task_publish.disconnect(tag)
        after_task_publish.disconnect(watch)

    [(_, message)] = _waiting(definition)
    assert message["headers"]["trace"] == "t-1"
    assert seen == [message["headers"]["id"]]


def test_every_message_gets_its_own_delivery_tag(definition: TaskDefinition) -> None:
    # kombu files a taken message under its tag in the unacked hash: a shared tag would let
    # one delivery overwrite another's entry there.
    run_id = new_run_id()
    for _ in range(3):
        publish(definition, run_id, job_id(TASK_ID, "ident", run_id), 5)

    tags = {message["properties"]["delivery_tag"] for _, message in _waiting(definition)}
    assert len(tags) == 3


def test_a_priority_kombu_would_round_is_refused(definition: TaskDefinition) -> None:
    run_id = new_run_id()
    with pytest.raises(ValueError, match="priority 4"):
        publish(definition, run_id, job_id(TASK_ID, "ident", run_id), 4)
    assert _waiting(definition) == []


def test_publishes_from_threads_and_a_forked_child_all_arrive(definition: TaskDefinition) -> None:
    # The web role publishes from request threads; worker pool children are forks of a process
    # that may have published already. One client, one connection pool, both cases.
    run_id = new_run_id()
    job = job_id(TASK_ID, "ident", run_id)
    publish(definition, run_id, job, 5)  # the pool now holds a connection

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            publish(definition, run_id, job, 5)
            code = 0
        finally:
            os._exit(code)
    threads = [
        threading.Thread(target=publish, args=(definition, run_id, job, 5)) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert len(_waiting(definition)) == 1 + 1 + 8
    publish(definition, run_id, job, 5)  # the parent's connection still works after the fork
    assert len(_waiting(definition)) == 11


@pytest.fixture
def own_broker(settings: LazySettings, tmp_path: Path) -> Iterator[ValkeyServer]:
    """A broker of the test's own, which it may restart: publishes go there meanwhile."""
    server = ValkeyServer(aof=False, log_path=tmp_path / "broker.log")
    server.start()
    usual = settings.CONFIG
    settings.CONFIG = dataclasses.replace(usual, celery_broker_url=server.url(0))
    broker.client.cache_clear()
    try:
        yield server
    finally:
        server.stop()
        settings.CONFIG = usual
        broker.client.cache_clear()  # the next client is the usual one again


def test_a_publish_after_the_broker_restarted_is_delivered(
    definition: TaskDefinition, own_broker: ValkeyServer
) -> None:
    run_id = new_run_id()
    job = job_id(TASK_ID, "ident", run_id)
    publish(definition, run_id, job, 5)
    assert len(_waiting(definition)) == 1

    own_broker.restart()  # SIGKILL: the pooled connection is dead, the message lost with it
    publish(definition, run_id, job, 5)

    [(_, message)] = _waiting(definition)
    assert message["headers"]["id"] == job


def test_a_publish_waits_for_a_broker_back_within_the_retry_window(
    definition: TaskDefinition, own_broker: ValkeyServer
) -> None:
    # As Celery's publish retry policy would: down for a moment is not a failed publish.
    own_broker.crash()
    comes_back = threading.Timer(0.1, own_broker.start)
    comes_back.start()
    run_id = new_run_id()
    try:
        publish(definition, run_id, job_id(TASK_ID, "ident", run_id), 5)
    finally:
        comes_back.join()

    assert len(_waiting(definition)) == 1


def test_a_dropped_connection_is_replaced_at_the_next_publish(definition: TaskDefinition) -> None:
    run_id = new_run_id()
    job = job_id(TASK_ID, "ident", run_id)
    publish(definition, run_id, job, 5)
    held = broker.client().client_id()  # the pool's one idle connection, the next to be used
    assert broker.client().client_id() == held

    # Closed by the server, as an idle timeout or a proxy would.
    killer = redis.Redis.from_url(django_settings.CONFIG.celery_broker_url)
    assert killer.client_kill_filter(_id=held) == 1
    killer.close()
    publish(definition, run_id, job, 5)

    assert len(_waiting(definition)) == 2


def test_a_start_whose_broker_went_down_leaves_a_pending_run(
    definition: TaskDefinition, own_broker: ValkeyServer
) -> None:
    with transaction.atomic():
        handle = start_run(TASK_ID, {"label": "down"}, trigger=TriggerKind.MANUAL)
        # Gone after admission read its depth, before the commit publishes.
        own_broker.crash()

    # Recorded and seeded; the reconciler publishes it once the broker is back.
    assert TaskHistory.objects.get(id=handle.run_id).state == RunState.PENDING
