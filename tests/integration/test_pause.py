"""Pause and resume (issue 27) with a real worker: a paused class holds its queued runs while
another class keeps running, nothing is lost or failed meanwhile, and the resume releases
them most urgent first; a paused class holds a pipeline's stage of its class too. Also: "pause
and refuse" refuses starts with nothing written, and the reconciler neither publishes again
nor fails a held run, and counts a released run's wait from its resume."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection

from orchestrator.cluster.leaders import CLUSTER
from orchestrator.hooks.pause import Paused
from orchestrator.models import PauseScope, TaskHistory, TaskPause
from orchestrator.recovery import pauses, windows
from orchestrator.recovery.pending import held_by_workers, in_broker_lists
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.routing import stage_queue
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.task_defs import ORDER_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

HELD_TASK = "test-record-order"  # class maintenance
HELD_QUEUE = f"task.t.{HELD_TASK}"
OTHER_TASK = "test-noop"  # class io
OTHER_QUEUE = f"task.t.{OTHER_TASK}"
HELD = 50
PRIORITIES = (7, 5, 3, 2, 1)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    _clean_keys()
    yield
    _clean_keys()


def _clean_keys() -> None:
    valkey.client().delete(keys.pauses(), ORDER_KEY, keys.orchestrator_lock(CLUSTER))
    for queue in (HELD_QUEUE, OTHER_QUEUE):
        empty_queues(queue)


def _states(task_id: str) -> list[str]:
    return list(TaskHistory.objects.filter(task_id=task_id).values_list("state", flat=True))


def _age_all(task_id: str, seconds: int) -> None:
    """Every run of the task `seconds` older, their order kept."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE task_history SET created_at = created_at - %s * interval '1 second', "
            "updated_at = updated_at - %s * interval '1 second' WHERE task_id = %s",
            [seconds, seconds, task_id],
        )


def test_a_paused_class_holds_its_runs_while_another_runs_then_drains_in_priority_order() -> None:
    pauses.pause(PauseScope.CLASS, "maintenance", by="ops", reason="disk full")
    labels = []
    for index in range(HELD):
        priority = PRIORITIES[index % len(PRIORITIES)]
        label = f"{priority}:{index:02d}"
        labels.append((priority, index, label))
        start_run(HELD_TASK, {"label": label}, trigger=TriggerKind.MANUAL, priority=priority)
    others = [start_run(OTHER_TASK, {}, trigger=TriggerKind.MANUAL).run_id for _ in range(10)]
    held = set(TaskHistory.objects.filter(task_id=HELD_TASK).values_list("id", flat=True))

    with worker_process([HELD_QUEUE, OTHER_QUEUE], concurrency=1, name="pause"):
        # The other class runs to the end while the paused one's messages are taken and
        # parked: acknowledged, nothing run, every run still pending.
        wait_for(lambda: _states(OTHER_TASK).count("completed") == len(others), timeout=60)
        # Only this test's runs: a message another test's worker left unacknowledged is not
        # this pause's concern.
        wait_for(
            lambda: not in_broker_lists([HELD_QUEUE]) and not held_by_workers() & held,
            timeout=60,
        )
        assert valkey.client().llen(ORDER_KEY) == 0
        assert _states(HELD_TASK) == ["pending"] * HELD

        # The reconciler, with every pending run past the check and the deadline: a held run
        # is not lost, so neither published again nor failed.
        _age_all(HELD_TASK, 10_000)
        config = settings.CONFIG
        settings.CONFIG = dataclasses.replace(
            config, pending_check_after_s=1, pending_deadline_s=600
        )
        try:
            report = Reconciler().tick()
        finally:
            settings.CONFIG = config
        assert report.held == HELD
        assert report.pending.republished == report.pending.failed == 0
        assert not in_broker_lists([HELD_QUEUE])
        assert _states(HELD_TASK) == ["pending"] * HELD

        resumed = pauses.resume(PauseScope.CLASS, "maintenance", by="ops")
        assert resumed.released == HELD
        wait_for(lambda: valkey.client().llen(ORDER_KEY) == HELD, timeout=120)

    order = valkey.client().lrange(ORDER_KEY, 0, -1)
    assert order == [label for _, _, label in sorted(labels)]
    assert TaskPause.objects.get(name="maintenance").resumed_by == "ops"


def test_pause_and_refuse_refuses_starts_and_writes_nothing() -> None:
    pauses.pause(PauseScope.TASK, OTHER_TASK, by="ops", reason="vendor down", refuse_starts=True)
    before = TaskHistory.objects.count()
    with pytest.raises(Paused) as refused:
        start_run(OTHER_TASK, {}, trigger=TriggerKind.MANUAL)
    assert refused.value.http_status == 503 and refused.value.code == "paused"
    assert TaskHistory.objects.count() == before
    # Another task of the same class is not paused.
    start_run("test-versioned", {}, trigger=TriggerKind.MANUAL)
    pauses.resume(PauseScope.TASK, OTHER_TASK, by="ops")
    start_run(OTHER_TASK, {}, trigger=TriggerKind.MANUAL)


def test_a_released_run_waits_from_the_resume_and_the_mirror_is_rebuilt() -> None:
    pauses.pause(PauseScope.TASK, HELD_TASK, by="ops", reason="maintenance window")
    run_id = start_run(HELD_TASK, {"label": "x"}, trigger=TriggerKind.MANUAL).run_id
    # Valkey lost the mirror: the reconciler writes it again from task_pause.
    valkey.client().delete(keys.pauses())
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, pending_check_after_s=1, pending_deadline_s=600)
    try:
        _age_all(HELD_TASK, 10_000)
        report = Reconciler().tick()
        assert report.held == 1
        windows.tick()  # the leader's windows loop keeps the whole mirror
        assert valkey.client().hgetall(keys.pauses()) == {f"task:{HELD_TASK}": "hold"}
        pauses.resume(PauseScope.TASK, HELD_TASK, by="ops")
        # Pending for 10,000 s but released just now: not past the 600 s deadline.
        report = Reconciler().tick()
        assert report.pending.failed == 0
        assert TaskHistory.objects.get(id=run_id).state == "pending"
    finally:
        settings.CONFIG = config


PIPE = "test-pipe"  # class io; its stage `right` is of class cpu


def _stage_states(run_id: str) -> dict[str, str]:
    return dict(TaskHistory.objects.get(id=run_id).stages)


def test_a_paused_class_holds_a_stage_of_its_class_until_the_resume() -> None:
    definition = registry.get()[PIPE]
    per_task = settings.CONFIG.per_task_queues
    queues = sorted({stage_queue(definition, s, per_task) for s in definition.pipeline})
    pauses.pause(PauseScope.CLASS, "cpu", by="ops", reason="encoder upgrade")
    run_id = start_run(PIPE, {}, trigger=TriggerKind.MANUAL).run_id

    with worker_process(queues, concurrency=1, name="pause-pipe"):
        # The io stages run; `right` (cpu) is taken, parked and waits, and so does the stage
        # after it: the run stays active, nothing failed.
        wait_for(lambda: _stage_states(run_id).get("final") == "completed", timeout=60)
        wait_for(
            lambda: (
                not in_broker_lists(queues)
                and not any(held.startswith(run_id) for held in held_by_workers())
            ),
            timeout=60,
        )
        assert _stage_states(run_id)["right"] == "waiting"
        assert _stage_states(run_id)["after-right"] == "waiting"
        # The stalled-pipeline chore does not publish a held stage again.
        config = settings.CONFIG
        settings.CONFIG = dataclasses.replace(config, pipeline_recover_after_s=0)
        try:
            report = Reconciler().tick()
        finally:
            settings.CONFIG = config
        assert report.chores["pipelines"] == 0
        assert not in_broker_lists(queues)
        assert TaskHistory.objects.get(id=run_id).state == "active"

        resumed = pauses.resume(PauseScope.CLASS, "cpu", by="ops")
        assert resumed.released == 1
        wait_for(lambda: TaskHistory.objects.get(id=run_id).state == "completed", timeout=60)
    assert set(_stage_states(run_id).values()) == {"completed"}
