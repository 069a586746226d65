"""A message published without a priority is never taken as the most urgent.

kombu's Redis transport files a message without a priority under 0, its most urgent step,
unless `task_default_priority` is set. Settings make it 5 (scheduled work), so on
a real worker it waits behind 1, 2 and 3, and ahead of 7. The messages are published by hand,
as a caller bypassing `start_run` would, to the private queue only this test's worker consumes.
"""

from __future__ import annotations

import pytest
from celery import current_app
from django.conf import settings

from orchestrator.models import TaskHistory
from orchestrator.runs.start import new_run_id
from orchestrator.stores import live, valkey
from orchestrator.stores.broker import job_id
from tasks import registry
from tests.support.fixtures import SHARED_TASKS, wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.task_defs import ORDER_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TASK_ID = "test-record-order"
QUEUE = "task.t.test-record-order"
UNSET = "unset"


def _publish(label: str, priority: int | None) -> None:
    """What `start_run` writes (row, live hash), then a message with or without a priority."""
    definition = registry.get()[TASK_ID]
    run_id = new_run_id()
    recorded = settings.CELERY_TASK_DEFAULT_PRIORITY if priority is None else priority
    TaskHistory.objects.create(
        id=run_id,
        task_id=TASK_ID,
        priority=recorded,
        identity=label,
        trigger={"kind": "manual"},
        input={"label": label},
        processing_version=definition.processing_version,
    )
    live.seed(run_id, TASK_ID, recorded, definition.stage_order)
    options = {} if priority is None else {"priority": priority}
    current_app.send_task(
        TASK_ID,
        args=[run_id, definition.processing_version],
        task_id=job_id(TASK_ID, label, run_id),
        queue=QUEUE,
        **options,
    )


def test_the_settings_this_test_relies_on() -> None:
    assert TASK_ID not in SHARED_TASKS
    assert settings.CELERY_TASK_DEFAULT_PRIORITY == 5
    assert settings.CELERY_BROKER_TRANSPORT_OPTIONS["priority_steps"] == [1, 2, 3, 5, 7]


def _taken_in_order(published: list[tuple[str, int | None]]) -> list[str]:
    """Publish every (label, priority) while no worker runs, then let one worker take them."""
    client = valkey.client()
    client.delete(ORDER_KEY)
    # A message an earlier test left in this queue would run too: its run's message carries
    # its input, and Valkey still holds its live hash (runs.publish.Carried).
    empty_queues(QUEUE)
    for label, priority in published:
        _publish(label, priority)

    with worker_process([QUEUE], concurrency=1, name="default-priority"):
        wait_for(lambda: client.llen(ORDER_KEY) == len(published), timeout=60)

    order: list[str] = client.lrange(ORDER_KEY, 0, -1)
    return order


def test_an_unset_priority_waits_behind_urgent_work() -> None:
    # The unset message goes first, so a FIFO broker, or one filing it as 0, hands it out first.
    order = _taken_in_order([(UNSET, None), ("p7", 7), ("p5", 5), ("p3", 3), ("p2", 2), ("p1", 1)])

    assert order[:3] == ["p1", "p2", "p3"]
    assert sorted(order[3:]) == sorted([UNSET, "p5", "p7"])
    assert set(TaskHistory.objects.values_list("state", flat=True)) == {"completed"}


def test_an_unset_priority_is_filed_as_the_default_5() -> None:
    # Filed as 5, the unset message is taken before a 7 published ahead of it.
    assert _taken_in_order([("p7", 7), (UNSET, None)]) == [UNSET, "p7"]
