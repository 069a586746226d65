"""Pickup order on a real worker follows priority (1 most urgent, 7 least)."""

from __future__ import annotations

import pytest

from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.task_defs import ORDER_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_waiting_runs_are_taken_most_urgent_first() -> None:
    client = valkey.client()
    client.delete(ORDER_KEY)
    submitted = [7, 5, 3, 2, 1, 7, 5, 3, 2, 1]
    for index, priority in enumerate(submitted):
        start_run(
            "test-record-order",
            {"label": f"{priority}:{index}"},
            trigger=TriggerKind.MANUAL,
            priority=priority,
        )
    unset = start_run("test-record-order", {"label": "default"}, trigger=TriggerKind.SYSTEM)
    assert unset.priority == 7

    with worker_process(["task.t.test-record-order"], concurrency=1, name="order"):
        wait_for(lambda: client.llen(ORDER_KEY) == len(submitted) + 1)

    order = client.lrange(ORDER_KEY, 0, -1)
    priorities = [int(label.split(":")[0]) if ":" in label else 7 for label in order]
    assert priorities == sorted(priorities)
    # Within one priority, first in is first out.
    assert order[:2] == ["1:4", "1:9"]


def test_under_load_an_operator_retry_overtakes_waiting_work() -> None:
    client = valkey.client()
    client.delete(ORDER_KEY)
    for index in range(5):
        start_run(
            "test-record-order",
            {"label": f"7:{index}", "seconds": 0.05},
            trigger=TriggerKind.SYSTEM,
            priority=7,
        )
    for index in range(30):
        start_run(
            "test-record-order",
            {"label": f"5:{index}", "seconds": 0.05},
            trigger=TriggerKind.SCHEDULE,
            priority=5,
        )

    with worker_process(["task.t.test-record-order"], concurrency=1, name="load"):
        wait_for(lambda: client.llen(ORDER_KEY) >= 5)  # the worker is busy with priority 5
        for index in range(3):
            start_run(
                "test-record-order",
                {"label": f"1:{index}"},
                trigger=TriggerKind.OPERATOR_RETRY,
            )
        taken_before_retries = client.llen(ORDER_KEY)
        wait_for(lambda: client.llen(ORDER_KEY) == 38)

    order = [label.split(":")[0] for label in client.lrange(ORDER_KEY, 0, -1)]
    retries = [i for i, p in enumerate(order) if p == "1"]
    last_five = max(i for i, p in enumerate(order) if p == "5")
    # The retries are taken next (give or take the one message a worker has reserved),
    # long before the priority-5 backlog drains; priority 7 waits behind everything.
    assert max(retries) <= taken_before_retries + len(retries) + 1
    assert max(retries) < last_five
    assert order[-5:] == ["7"] * 5
