"""Delayed starts (`start_run(..., not_before=...)`, `runs.due`): a run waits `pending` with
nothing in Valkey or the broker, starts once its time has come and not before, survives the
worker role's restart while it waits, and can be cancelled while it waits."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import LazySettings, settings
from django.test import Client

from orchestrator.api import tokens
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.models import TaskHistory
from orchestrator.runs import due
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.due import due_time
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.start import start_run
from orchestrator.stores import broker, keys, valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import ROOT, database_url, wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.users import PASSWORD, operator

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-starts"  # no shared worker takes its queue
QUEUE = "task.t.test-starts"


def _row(run_id: str) -> TaskHistory:
    return TaskHistory.objects.get(id=run_id)


def _queued() -> int:
    return broker.depth([QUEUE])


@pytest.fixture(autouse=True)
def _empty_queue() -> Iterator[None]:
    yield
    empty_queues(QUEUE)


@pytest.fixture
def loops() -> object:
    """The worker role's loops process (the `due` loop runs on its leader)."""
    valkey.client().delete(keys.orchestrator_lock(CLUSTER))
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        env = {**os.environ, "DATABASE_URL": database_url(), "LUMASTRA_WORKER_MODE": "enabled"}
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.loops"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)
    valkey.client().delete(keys.orchestrator_lock(CLUSTER))


def test_a_delayed_run_waits_with_nothing_queued_then_starts_on_time(loops: object) -> None:
    handle = start_run(TASK, {}, trigger=TriggerKind.MANUAL, not_before=timedelta(seconds=3))
    row = _row(handle.run_id)
    assert row.state == "pending"
    assert row.not_before is not None
    assert row.trigger["notBefore"] == row.not_before.isoformat()
    # Neither a live hash (it would expire before a run due in a week) nor a message yet.
    assert not valkey.client().exists(keys.run_active(handle.run_id))
    assert _queued() == 0
    assert due.release() == 0  # not due yet

    loops()  # type: ignore[operator]
    with worker_process([QUEUE], name="delayed"):
        wait_for(lambda: _row(handle.run_id).state == "completed", timeout=30)

    ended = _row(handle.run_id)
    assert ended.started_at is not None
    assert ended.started_at >= row.not_before, "started before its time"
    assert ended.not_before is None  # released


def test_a_waiting_run_survives_the_worker_role_restarting(loops: object) -> None:
    # Due after the first role has started, taken the seat and been killed: 4 s was not always
    # enough beside the fault battery (the first role released and ran it before its kill).
    handle = start_run(TASK, {}, trigger=TriggerKind.MANUAL, not_before=timedelta(seconds=10))
    due_at = _row(handle.run_id).not_before
    assert due_at is not None
    first = loops()  # type: ignore[operator]
    with worker_process([QUEUE], name="delayed-first"):
        wait_for(lambda: valkey.client().get(keys.orchestrator_lock(CLUSTER)), timeout=30)
    first.send_signal(signal.SIGKILL)  # the whole role gone while the run waits
    first.wait(timeout=10)
    valkey.client().delete(keys.orchestrator_lock(CLUSTER))  # its seat, as its TTL would
    assert _row(handle.run_id).state == "pending"

    loops()  # type: ignore[operator]
    with worker_process([QUEUE], name="delayed-second"):
        wait_for(lambda: _row(handle.run_id).state == "completed", timeout=30)
    assert _row(handle.run_id).started_at >= due_at


def test_a_run_cancelled_while_it_waits_is_never_released() -> None:
    handle = start_run(TASK, {}, trigger=TriggerKind.MANUAL, not_before=timedelta(seconds=0.5))

    assert request_cancel(handle.run_id, actor="ops") == "cancelled"

    wait_for(lambda: datetime.now(UTC) > _row(handle.run_id).created_at + timedelta(seconds=1))
    assert due.release() == 0
    assert _row(handle.run_id).state == "cancelled"
    assert _queued() == 0


def test_a_due_run_is_seeded_and_published_once() -> None:
    handles = [
        start_run(TASK, {}, trigger=TriggerKind.MANUAL, not_before=timedelta(seconds=0.2))
        for _ in range(3)
    ]
    wait_for(lambda: datetime.now(UTC) > _row(handles[-1].run_id).not_before)

    assert due.release() == 3
    assert due.release() == 0  # released once: the next look finds nothing
    assert _queued() == 3
    for handle in handles:
        assert valkey.client().hget(keys.run_active(handle.run_id), "state") == "pending"


def test_a_time_already_past_starts_now_and_bad_times_are_refused() -> None:
    now = datetime.now(UTC)
    assert due_time(now - timedelta(minutes=5)) is None
    assert due_time(timedelta(0)) is None
    assert due_time(timedelta(days=29)) is not None
    with pytest.raises(StartRefused, match="LUMASTRA_MAX_START_DELAY_S"):
        due_time(timedelta(days=31))
    with pytest.raises(StartRefused, match="time zone"):
        due_time(datetime(2030, 1, 1))

    handle = start_run(TASK, {}, trigger=TriggerKind.MANUAL, not_before=now - timedelta(hours=1))
    assert _row(handle.run_id).not_before is None
    assert _queued() == 1  # published at once, as a start without a delay


def _client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator(), 'delay')[1]}"})


def test_the_api_takes_a_time_or_a_delay_and_shows_when_the_run_is_due() -> None:
    client = _client()
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    answer = client.post(
        "/api/v1/runs",
        {"task": TASK, "not_before": at.isoformat()},
        content_type="application/json",
    )
    assert answer.status_code == 202, answer.content
    run_id = answer.json()["run_id"]
    shown = client.get(f"/api/v1/runs/{run_id}").json()
    assert datetime.fromisoformat(shown["not_before"]) == at

    answer = client.post(
        "/api/v1/runs", {"task": TASK, "delay_s": 600}, content_type="application/json"
    )
    assert answer.status_code == 202
    waiting = _row(answer.json()["run_id"]).not_before
    assert waiting is not None
    assert timedelta(seconds=590) < waiting - datetime.now(UTC) <= timedelta(seconds=600)
    assert _queued() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"not_before": "tomorrow"}, "not_before"),
        ({"not_before": "2030-01-01T00:00:00"}, "not_before"),  # no offset
        ({"delay_s": -1}, "delay_s"),
        ({"delay_s": 5, "not_before": "2030-01-01T00:00:00Z"}, "not_before or delay_s"),
        ({"delay_s": 40 * 86400}, "LUMASTRA_MAX_START_DELAY_S"),
    ],
)
def test_a_bad_time_is_a_422_naming_the_field(body: dict[str, object], field: str) -> None:
    before = TaskHistory.objects.count()
    answer = _client().post("/api/v1/runs", {"task": TASK, **body}, content_type="application/json")

    assert answer.status_code == 422, answer.content
    assert field in answer.content.decode()
    assert TaskHistory.objects.count() == before


def test_the_console_shows_when_a_waiting_run_is_due() -> None:
    handle = start_run(TASK, {}, trigger=TriggerKind.MANUAL, not_before=timedelta(hours=3))
    user = operator("delay-console")
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)

    page = client.get(f"/admin/orchestrator/taskhistory/{handle.run_id}/change/")
    listed = client.get("/admin/orchestrator/taskhistory/")

    assert page.status_code == 200
    assert "scheduled for" in page.content.decode()
    assert listed.status_code == 200
    assert "scheduled for" in listed.content.decode()


def test_a_delayed_runs_identity_is_held_until_its_time_and_a_ttl_after() -> None:
    handle = start_run(
        "test-unique", {"key": "later"}, trigger=TriggerKind.MANUAL, not_before=timedelta(days=3)
    )
    held_ms = valkey.client().pttl(keys.identity("test-unique", "later"))
    ttl_ms = settings.CONFIG.identity_ttl_s * 1000

    # Past the plain TTL (a day): a start of the same work the day after still joins it.
    assert held_ms > ttl_ms + timedelta(days=2, hours=23).total_seconds() * 1000
    again = start_run("test-unique", {"key": "later"}, trigger=TriggerKind.MANUAL)
    assert again.deduplicated and again.run_id == handle.run_id


def test_backpressure_does_not_judge_a_delayed_start(settings: LazySettings) -> None:
    overrides = {**settings.CONFIG.queue_depth_cap_overrides, "discovery": 1}
    settings.CONFIG = dataclasses.replace(settings.CONFIG, queue_depth_cap_overrides=overrides)
    queue = "task.t.test-bp-drop"
    try:
        start_run("test-bp-drop", {}, trigger=TriggerKind.MANUAL)  # the queue is full now
        later = start_run(
            "test-bp-drop", {}, trigger=TriggerKind.MANUAL, not_before=timedelta(hours=1)
        )
        now = start_run("test-bp-drop", {}, trigger=TriggerKind.MANUAL)
    finally:
        empty_queues(queue)

    assert not later.dropped  # it joins no queue for an hour
    assert _row(later.run_id).state == "pending"
    assert now.dropped


def test_a_run_recorded_for_an_older_version_is_released_with_it() -> None:
    handle = start_run(TASK, {}, trigger=TriggerKind.MANUAL, not_before=timedelta(seconds=0.2))
    TaskHistory.objects.filter(id=handle.run_id).update(processing_version=0)
    wait_for(lambda: datetime.now(UTC) > _row(handle.run_id).not_before)

    assert due.release() == 1

    (message,) = broker.client().lrange(keys.broker_queue(QUEUE, 2), 0, -1)
    body = json.loads(base64.b64decode(json.loads(message)["body"]))
    assert body[0] == [handle.run_id, 0]  # its pickup fails it as stale_version
