"""Backpressure at a class's queue cap: drop, fail-fast and shed-oldest, nothing unrecorded."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import LazySettings
from django.test import Client

from orchestrator.api import tokens
from orchestrator.clock import SYSTEM, FrozenClock
from orchestrator.hooks import quotas
from orchestrator.hooks.base import Admission
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.runs.admission import DEPTH_FRESH, QueueCap, QueueFull
from orchestrator.runs.start import new_run_id, start_run
from orchestrator.stores import broker, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.messages import empty_queues
from tests.support.round_trips import recording
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _queues_emptied() -> None:
    _empty_queues()


def _empty_queues() -> None:
    for task in ("test-bp-drop", "test-bp-fail", "test-bp-shed"):
        empty_queues(f"task.t.{task}")


def _cap(settings: LazySettings, resource_class: str, cap: int) -> None:
    overrides = {**settings.CONFIG.queue_depth_cap_overrides, resource_class: cap}
    settings.CONFIG = dataclasses.replace(settings.CONFIG, queue_depth_cap_overrides=overrides)


def _refusals(task: str) -> dict[str, str]:
    day = TaskHistory.objects.values_list("created_at", flat=True).first()
    assert day is not None
    return valkey.client().hgetall(keys.refusals(task, day.date().isoformat()))


def test_drop_records_the_start_as_dropped_and_enqueues_nothing(settings: LazySettings) -> None:
    _cap(settings, "discovery", 2)
    kept = [start_run("test-bp-drop", {}, trigger=TriggerKind.MANUAL) for _ in range(2)]

    dropped = start_run("test-bp-drop", {}, trigger=TriggerKind.MANUAL)

    assert dropped.dropped and not any(h.dropped for h in kept)
    row = TaskHistory.objects.get(id=dropped.run_id)
    assert row.state == "cancelled"
    assert row.error["kind"] == "dropped"
    assert "at its cap of 2" in row.error["message"]
    assert broker.depth(["task.t.test-bp-drop"]) == 2
    assert live.read(dropped.run_id) == {}
    assert _refusals("test-bp-drop") == {"dropped": "1"}


def test_fail_fast_refuses_with_a_retry_hint_and_writes_nothing(settings: LazySettings) -> None:
    _cap(settings, "embedding", 2)
    for _ in range(2):
        start_run("test-bp-fail", {}, trigger=TriggerKind.MANUAL)

    with pytest.raises(QueueFull, match=r"'embedding' queue holds 2 waiting runs") as refused:
        start_run("test-bp-fail", {}, trigger=TriggerKind.MANUAL)

    assert refused.value.retry_after is not None
    assert refused.value.http_status == 503
    assert TaskHistory.objects.count() == 2
    assert broker.depth(["task.t.test-bp-fail"]) == 2
    assert _refusals("test-bp-fail") == {"queue_full": "1"}
    # The admission script counted the refused start in its day (an uncapped task); the cap's
    # refusal gave it back.
    definition = registry.get()["test-bp-fail"]
    assert quotas.usage([definition], SYSTEM.now().date())["test-bp-fail"].started == 2


def _shed(key: str, priority: int) -> str:
    return start_run(
        "test-bp-shed", {"key": key}, trigger=TriggerKind.MANUAL, priority=priority
    ).run_id


def test_shed_oldest_cancels_the_least_urgent_oldest_waiting_runs(
    settings: LazySettings,
) -> None:
    _cap(settings, "analysis", 3)
    old7, mid5, new7 = _shed("old7", 7), _shed("mid5", 5), _shed("new7", 7)

    urgent = _shed("urgent", 2)

    states = dict(TaskHistory.objects.values_list("id", "state"))
    assert states == {old7: "cancelled", mid5: "pending", new7: "pending", urgent: "pending"}
    shed = TaskHistory.objects.get(id=old7)
    assert shed.error["kind"] == "shed"
    assert urgent in shed.error["message"]
    assert live.read(old7)["state"] == "cancelled"
    assert broker.depth(["task.t.test-bp-shed"]) == 3

    # Among equals the oldest goes: a new priority-7 run replaces the older one.
    newest7 = _shed("newest7", 7)
    assert TaskHistory.objects.get(id=new7).state == "cancelled"
    assert TaskHistory.objects.get(id=newest7).state == "pending"


def test_shed_oldest_never_sheds_more_urgent_work(settings: LazySettings) -> None:
    _cap(settings, "analysis", 2)
    urgent = [_shed("u1", 1), _shed("u2", 1)]

    with pytest.raises(QueueFull):
        _shed("late", 7)

    assert set(TaskHistory.objects.values_list("state", flat=True)) == {"pending"}
    assert set(TaskHistory.objects.values_list("id", flat=True)) == set(urgent)


def _api() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator(), 'tests')[1]}"})


def _post(client: Client, task: str) -> Any:
    return client.post("/api/v1/runs", {"task": task}, content_type="application/json")


def test_over_http_a_drop_is_a_200_and_fail_fast_a_503_with_retry_after(
    settings: LazySettings,
) -> None:
    _cap(settings, "discovery", 1)
    _cap(settings, "embedding", 1)
    client = _api()
    assert _post(client, "test-bp-drop").status_code == 202
    assert _post(client, "test-bp-fail").status_code == 202

    dropped = _post(client, "test-bp-drop")
    refused = _post(client, "test-bp-fail")

    assert dropped.status_code == 200
    assert dropped.json()["dropped"] is True and dropped.json()["state"] == "cancelled"
    assert refused.status_code == 503
    assert refused.json()["code"] == "queue_full"
    assert int(refused["Retry-After"]) >= 1


def test_a_dropped_start_gives_its_quota_unit_back(settings: LazySettings) -> None:
    _cap(settings, "embedding", 1)
    empty_queues("task.t.test-quota-drop")
    start_run("test-bp-fail", {}, trigger=TriggerKind.MANUAL)  # the class is now full

    dropped = [start_run("test-quota-drop", {}, trigger=TriggerKind.MANUAL) for _ in range(4)]

    # Four drops against a quota of three: none consumed a unit, none was refused.
    assert all(handle.dropped for handle in dropped)
    usage = TaskQuotaUsage.objects.get(task_id="test-quota-drop")
    assert usage.started == 0


def _depth_reads(cap: QueueCap, task: str, starts: int) -> int:
    """Broker round trips `starts` admissions of `task` cost the queue cap."""
    definition = registry.get()[task]
    with recording() as caught:
        for _ in range(starts):
            admission = Admission(definition, new_run_id(), "i", 5, {})
            cap.judge(admission)
    return caught.counts().broker


def test_far_below_the_cap_a_fresh_depth_reading_stands_in_for_the_next_starts(
    settings: LazySettings,
) -> None:
    _cap(settings, "discovery", 10)
    clock = FrozenClock(datetime(2026, 12, 1, tzinfo=UTC))
    cap = QueueCap(clock=clock)

    # One reading, then starts counted on it while they keep it at most half the cap (5).
    assert _depth_reads(cap, "test-bp-drop", 5) == 1
    # Past half the cap every start reads the depth afresh.
    for _ in range(6):
        start_run("test-bp-drop", {}, trigger=TriggerKind.MANUAL)
    assert _depth_reads(cap, "test-bp-drop", 2) == 2
    assert cap._readings["discovery"].depth == 6
    # A reading older than DEPTH_FRESH is read again, however far below the cap.
    _empty_queues()
    assert _depth_reads(cap, "test-bp-drop", 1) == 1
    clock.advance(DEPTH_FRESH)
    assert _depth_reads(cap, "test-bp-drop", 2) == 1
    # A fresh reading counts for the cap it was judged by: a new one is read against at once.
    _cap(settings, "discovery", 8)
    assert _depth_reads(cap, "test-bp-drop", 1) == 1
