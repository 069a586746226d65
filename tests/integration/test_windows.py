"""Run windows (issue 38) with a real worker: a closed class window holds its queued runs while
another class keeps running (starts are taken, nothing failed or lost, the reconciler leaves
them alone), an operator's priority-1 run passes it, and the opening releases them most urgent
first. The API: an operator's window set, listed and removed, bad input refused with the field
named and nothing written; a held run says by what and until when; /metrics counts them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from orchestrator import windows
from orchestrator.api import tokens
from orchestrator.clock import FrozenClock
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.models import PauseScope, RunWindow, TaskHistory
from orchestrator.recovery import pauses
from orchestrator.recovery import windows as opening
from orchestrator.recovery.pending import held_by_workers, in_broker_lists
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.runs import due
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, live, valkey
from orchestrator.triggers import TriggerKind
from tasks.window import Window
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.metrics import scrape
from tests.support.task_defs import ORDER_KEY
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

HELD_TASK = "test-record-order"  # class maintenance
HELD_QUEUE = f"task.t.{HELD_TASK}"
OTHER_TASK = "test-noop"  # class io
OTHER_QUEUE = f"task.t.{OTHER_TASK}"
HELD = 50
PRIORITIES = (7, 5, 3, 2)  # 1 is an operator's: it passes the window


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    _clean_keys()
    yield
    _clean_keys()


def _clean_keys() -> None:
    valkey.client().delete(keys.pauses(), ORDER_KEY, keys.orchestrator_lock(CLUSTER))
    for queue in (HELD_QUEUE, OTHER_QUEUE):
        empty_queues(queue)


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})


def _closed_now() -> Window:
    """A window of an hour that opens three hours from now (UTC), so it is closed now."""
    opens = timezone.now().astimezone(UTC) + timedelta(hours=3)
    closes = opens + timedelta(hours=1)
    return Window(f"{opens:%H:%M}-{closes:%H:%M}", tz="UTC")


def _states(task_id: str) -> list[str]:
    return list(TaskHistory.objects.filter(task_id=task_id).values_list("state", flat=True))


@pytest.mark.worker
def test_a_closed_class_window_holds_its_runs_then_releases_them_most_urgent_first(
    client: Client,
) -> None:
    scoped = opening.set_window(PauseScope.CLASS, "maintenance", _closed_now(), by="ops")
    state = scoped.state(timezone.now())
    assert not state.open and state.opens_at is not None
    assert valkey.client().hget(keys.pauses(), "class:maintenance") == live.WINDOW

    labels = []
    for index in range(HELD):
        priority = PRIORITIES[index % len(PRIORITIES)]
        label = f"{priority}:{index:02d}"
        labels.append((priority, index, label))
        start_run(HELD_TASK, {"label": label}, trigger=TriggerKind.MANUAL, priority=priority)
    rush = start_run(
        HELD_TASK, {"label": "rush"}, trigger=TriggerKind.OPERATOR_RETRY, priority=1
    ).run_id
    others = [start_run(OTHER_TASK, {}, trigger=TriggerKind.MANUAL).run_id for _ in range(10)]
    held = set(TaskHistory.objects.filter(task_id=HELD_TASK).values_list("id", flat=True))
    held.discard(rush)

    with worker_process([HELD_QUEUE, OTHER_QUEUE], concurrency=1, name="window"):
        wait_for(lambda: _states(OTHER_TASK).count("completed") == len(others), timeout=60)
        wait_for(lambda: TaskHistory.objects.get(id=rush).state == "completed", timeout=60)
        wait_for(
            lambda: not in_broker_lists([HELD_QUEUE]) and not held_by_workers() & held,
            timeout=60,
        )
        assert valkey.client().lrange(ORDER_KEY, 0, -1) == ["rush"]
        assert sorted(_states(HELD_TASK)) == ["completed"] + ["pending"] * HELD

        # What a held run says, and what /metrics counts.
        sample = next(iter(held))
        detail = client.get(f"/api/v1/runs/{sample}").json()
        assert detail["held"]["by"] == "window"
        assert (detail["held"]["scope"], detail["held"]["name"]) == ("class", "maintenance")
        assert datetime.fromisoformat(detail["held"]["opens_at"]) == state.opens_at
        says = f"waits for window (opens {state.opens_at:%H:%M} UTC)"
        assert detail["held"]["says"] == says
        console = Client()
        console.force_login(operator("console"))
        page = console.get(reverse("admin:orchestrator_taskhistory_change", args=[sample]))
        assert says in page.content.decode()
        scope = (("class", "maintenance"), ("task", HELD_TASK))
        assert scrape()[("lumastra_window_held_runs", scope)] == HELD

        # The reconciler, every pending run past the check and the deadline: a held run is
        # neither published again nor failed.
        config = settings.CONFIG
        settings.CONFIG = dataclasses.replace(config, pending_check_after_s=0, pending_deadline_s=1)
        try:
            report = Reconciler().tick()
        finally:
            settings.CONFIG = config
        assert report.held == HELD
        assert report.pending.republished == report.pending.failed == 0
        assert sorted(_states(HELD_TASK)) == ["completed"] + ["pending"] * HELD

        # The window opens: the leader's tick releases the held runs, most urgent first.
        released = opening.tick(clock=FrozenClock(state.opens_at + timedelta(seconds=1)))
        assert released == HELD
        assert valkey.client().hget(keys.pauses(), "class:maintenance") is None
        wait_for(lambda: valkey.client().llen(ORDER_KEY) == HELD + 1, timeout=120)

    order = valkey.client().lrange(ORDER_KEY, 0, -1)
    assert order == ["rush"] + [label for _, _, label in sorted(labels)]


SLEEPY = "test-sleepy"  # class io; sleeps with ctx.sleep, which a stop interrupts
SLEEPY_QUEUE = f"task.t.{SLEEPY}"


def _row(run_id: str) -> TaskHistory:
    return TaskHistory.objects.get(id=run_id)


@pytest.mark.worker
def test_a_window_closing_with_stop_puts_its_running_run_back_without_spending_an_attempt() -> None:
    now = timezone.now().astimezone(UTC)
    opened, closes = now - timedelta(minutes=1), now + timedelta(hours=2)
    window = Window(f"{opened:%H:%M}-{closes:%H:%M}", tz="UTC", on_close="stop")
    state = opening.set_window(PauseScope.TASK, SLEEPY, window, by="ops").state(now)
    assert state.open
    empty_queues(SLEEPY_QUEUE)
    with worker_process([SLEEPY_QUEUE], concurrency=1, name="window-stop"):
        run_id = start_run(SLEEPY, {"seconds": 8}, trigger=TriggerKind.MANUAL).run_id
        # Postgres hears of the claim a second into the run (`runs.watch`).
        wait_for(lambda: _row(run_id).state == "active", timeout=30)
        assert _row(run_id).attempts == 1

        after_close = state.closes_at + timedelta(seconds=1)
        opening.tick(clock=FrozenClock(after_close))
        wait_for(lambda: _row(run_id).state == "pending", timeout=30)
        row = _row(run_id)
        assert row.attempts == 0 and row.error["kind"] == "window_closed"
        assert row.not_before is None and due.release() == 0  # not a delayed start
        # Its message comes back and is parked: the window holds the same run.
        wait_for(
            lambda: not in_broker_lists([SLEEPY_QUEUE]) and run_id not in held_by_workers(),
            timeout=30,
        )
        assert _row(run_id).state == "pending"

        next_open = windows.state_of(window, "UTC", after_close).opens_at
        assert next_open is not None
        assert opening.tick(clock=FrozenClock(next_open + timedelta(seconds=1))) == 1
        wait_for(lambda: _row(run_id).state == "completed", timeout=60)
    row = _row(run_id)
    assert row.attempts == 1 and row.error is None


def _put(client: Client, path: str, body: Any) -> Any:
    return client.put(f"/api/v1{path}", json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"window": "25:00-06:00"}, "window"),
        ({"window": "01:00-06:00", "tz": "Mars/Olympus"}, "tz"),
        ({"window": "01:00-06:00", "days": "someday"}, "days"),
        ({"window": "01:00-06:00", "on_close": "later"}, "on_close"),
        ({"window": "01:00-06:00", "colour": "red"}, "colour"),
    ],
)
def test_a_bad_window_is_refused_naming_the_field_and_nothing_is_written(
    client: Client, body: dict[str, str], field: str
) -> None:
    answer = _put(client, "/classes/analysis/window", body)
    assert answer.status_code == 422, answer.content
    assert any(error["loc"][-1] == field for error in answer.json()["errors"])
    assert not RunWindow.objects.exists()
    assert not valkey.client().exists(keys.pauses())


def test_an_operators_window_is_set_listed_and_removed(client: Client) -> None:
    assert _put(client, "/tasks/no-such-task/window", {"window": "01:00-06:00"}).status_code == 404
    assert _put(client, "/classes/nowhere/window", {"window": "01:00-06:00"}).status_code == 404

    body = {"window": "22:00-06:00", "days": "fri", "tz": "Europe/Berlin", "on_close": "stop"}
    answer = _put(client, f"/tasks/{OTHER_TASK}/window", body)
    assert answer.status_code == 200, answer.content
    found = answer.json()
    assert (found["scope"], found["name"], found["source"]) == ("task", OTHER_TASK, "operator")
    assert (found["window"], found["days"], found["tz"]) == ("22:00-06:00", "fri", "Europe/Berlin")
    assert found["on_close"] == "stop" and found["actor"] == "ops"
    listed = client.get("/api/v1/windows").json()
    assert [(w["scope"], w["name"]) for w in listed] == [("task", OTHER_TASK)]
    assert listed[0]["open"] == found["open"]
    assert listed[0]["closes_at"] == found["closes_at"]
    mirror = valkey.client().hget(keys.pauses(), f"task:{OTHER_TASK}")
    assert mirror == (None if found["open"] else live.WINDOW)

    removed = client.delete(f"/api/v1/tasks/{OTHER_TASK}/window").json()
    assert removed == {"removed": True, "window": None}
    assert client.get("/api/v1/windows").json() == []
    assert not valkey.client().hexists(keys.pauses(), f"task:{OTHER_TASK}")
    again = client.delete(f"/api/v1/tasks/{OTHER_TASK}/window").json()
    assert again == {"removed": False, "window": None}

    # A task window never open while its class's is: its runs would wait forever.
    assert _put(client, "/classes/io/window", {"window": "01:00-02:00"}).status_code == 200
    refused = _put(client, f"/tasks/{OTHER_TASK}/window", {"window": "03:00-04:00"})
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["loc"][-1] == "window"
    assert not RunWindow.objects.filter(scope="task").exists()
    assert _put(client, f"/tasks/{OTHER_TASK}/window", {"window": "01:30-05:00"}).status_code == 200


def test_a_resume_inside_a_closed_window_leaves_the_window_holding(client: Client) -> None:
    opening.set_window(PauseScope.TASK, OTHER_TASK, _closed_now(), by="ops")
    pauses.pause(PauseScope.TASK, OTHER_TASK, by="ops", reason="disk")
    assert valkey.client().hget(keys.pauses(), f"task:{OTHER_TASK}") == "hold"
    manual = start_run(OTHER_TASK, {}, trigger=TriggerKind.MANUAL).run_id
    held = client.get(f"/api/v1/runs/{manual}").json()["held"]
    assert held["by"] == "pause" and held["says"] == f"held by the pause of task {OTHER_TASK}"
    rush = start_run(OTHER_TASK, {}, trigger=TriggerKind.OPERATOR_RETRY, priority=1).run_id
    empty_queues(OTHER_QUEUE)  # both messages taken and parked, as a worker would
    resumed = pauses.resume(PauseScope.TASK, OTHER_TASK, by="ops")
    # The window still holds the manual run; the operator's passes it (`live.holds`).
    assert resumed.released == 1
    # Published again: waiting in its queue, or taken by a worker that consumes it (reserved,
    # or already claimed); the manual run's message is not.
    wait_for(
        lambda: (
            rush in in_broker_lists([OTHER_QUEUE]) | held_by_workers()
            or _row(rush).state != "pending"
        ),
        timeout=10,
    )
    assert manual not in in_broker_lists([OTHER_QUEUE]) and _row(manual).state == "pending"
    assert valkey.client().hget(keys.pauses(), f"task:{OTHER_TASK}") == live.WINDOW
    # The next tick finds the mirror as it should be.
    assert opening.tick() == 0
    assert valkey.client().hget(keys.pauses(), f"task:{OTHER_TASK}") == live.WINDOW
