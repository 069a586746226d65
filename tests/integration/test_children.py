"""Child runs (issue 40): a stage spawns children with `ctx.spawn`, written with its end; a stage
declared `await_children=True` runs once every child has ended, with their results; the first
failure of a `fail_parent` child fails the parent and cancels the others, `continue` runs the
stage with the failure seen; a cancel of the parent reaches its children. Real workers, the
leader's `batches` loop as `orchestrator.loops` runs it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db.models import Count
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from orchestrator.api import tokens
from orchestrator.models import RunBatch, TaskHistory, TaskHistoryAudit
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.handle import RunHandle
from orchestrator.runs.rerun import rerun
from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tests.support.child_defs import CHILD_RECORD, FAILING, WAITED_RECORD
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.metrics import scrape
from tests.support.runs import batches_loop
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

QUEUES = ["task.t.test-fan-out", "task.t.test-child", "task.t.test-spawner"]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    valkey.client().delete(CHILD_RECORD, WAITED_RECORD)
    valkey.client().set(FAILING, 1)
    empty_queues(*QUEUES)
    yield
    valkey.client().delete(CHILD_RECORD, WAITED_RECORD)


@pytest.fixture
def workers() -> Iterator[None]:
    with worker_process(QUEUES, concurrency=4, name="children"), batches_loop():
        yield


def _fan_out(input_: dict[str, Any]) -> RunHandle:
    return start_run("test-fan-out", input_, trigger=TriggerKind.API)


def _waited() -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in valkey.client().lrange(WAITED_RECORD, 0, -1)]


def _ended(run_id: str, timeout: float = 60) -> TaskHistory:
    terminal = ("completed", "failed", "cancelled")
    wait_for(
        lambda: TaskHistory.objects.filter(id=run_id, state__in=terminal).exists(),
        timeout=timeout,
    )
    return TaskHistory.objects.get(id=run_id)


def test_the_waiting_stage_runs_once_after_every_child_with_their_results(workers: None) -> None:
    handle = _fan_out({"count": 20, "seconds": 0.05})
    run = _ended(handle.run_id)
    assert run.state == "completed", run.error
    children = TaskHistory.objects.filter(parent_run_id=handle.run_id)
    assert children.count() == 20
    assert set(children.values_list("state", flat=True)) == {"completed"}
    assert all(c.trigger["kind"] == "child" and c.trigger["stage"] == "scan" for c in children)
    assert {c.priority for c in children} == {run.priority}
    (waited,) = _waited()
    assert waited["states"] == {"completed": 20} and waited["sum"] == sum(range(20))
    last_child_end = max(c.finished_at for c in children)
    collections = run.steps["collections"]
    assert collections["started_at"] >= last_child_end.isoformat()
    batch = RunBatch.objects.get(parent_run_id=handle.run_id)
    assert (batch.total, batch.open, batch.counts, batch.parent_stage) == (
        20,
        0,
        {"completed": 20},
        "scan",
    )
    assert run.result["collections"] == {"children": 20, "sum": sum(range(20))}


def test_500_children_through_10_sigkills_end_once_and_the_stage_runs_once_after_them() -> None:
    with worker_process(QUEUES, concurrency=4, name="children-kills"), batches_loop():
        handle = _fan_out({"count": 500, "seconds": 0.1, "on_failure": "continue"})
        killed = _kill_pool_children(10)
        run = _ended(handle.run_id, timeout=240)
    assert len(killed) == 10
    assert run.state == "completed", run.error
    children = TaskHistory.objects.filter(parent_run_id=handle.run_id)
    assert children.count() == 500
    assert set(children.values_list("state", flat=True)) == {"completed"}
    assert children.filter(attempts__gt=1).exists()  # some were killed mid-run and put back
    ends = (
        TaskHistoryAudit.objects.filter(run_id__in=children.values("id"))
        .filter(to_state__in=("completed", "failed", "cancelled"))
        .values_list("run_id")
        .annotate(n=Count("id"))
    )
    assert {n for _, n in ends} == {1} and len(ends) == 500  # every child ended once
    (waited,) = _waited()  # the waiting stage ran once
    assert waited["states"] == {"completed": 500} and waited["sum"] == sum(range(500))
    last_child_end = max(children.values_list("finished_at", flat=True))
    assert run.steps["collections"]["started_at"] >= last_child_end.isoformat()
    batch = RunBatch.objects.get(parent_run_id=handle.run_id)
    assert (batch.open, batch.counts) == (0, {"completed": 500})


def _kill_pool_children(kills: int) -> set[int]:
    """SIGKILL `kills` pool processes, each while it runs a child (the child's own record
    names it), half a second apart."""
    killed: set[int] = set()
    deadline = time.monotonic() + 120
    while len(killed) < kills and time.monotonic() < deadline:
        entries = [json.loads(e) for e in valkey.client().lrange(CHILD_RECORD, -4, -1)]
        pids = [e["pid"] for e in entries if e["pid"] not in killed]
        if not pids:
            time.sleep(0.05)
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[-1], signal.SIGKILL)
            killed.add(pids[-1])
        time.sleep(0.5)
    return killed


def test_a_failed_child_fails_its_parent_and_the_others_are_cancelled(workers: None) -> None:
    handle = start_run(
        "test-fan-out", {"count": 6, "fail": [0], "seconds": 3}, trigger=TriggerKind.API
    )
    run = _ended(handle.run_id)
    assert run.state == "failed"
    assert run.error["kind"] == "child_failed" and run.error["stage"] == "collections"
    assert _waited() == []
    children = TaskHistory.objects.filter(parent_run_id=handle.run_id)
    wait_for(lambda: not children.filter(state__in=("pending", "active", "cancelling")).exists())
    states = sorted(children.values_list("state", flat=True))
    assert states.count("failed") == 1
    assert "completed" not in states  # each takes 3 s: the cancel reached them first
    assert set(states) == {"failed", "cancelled"}


def test_a_resume_keeps_the_children_that_completed_and_runs_the_others(workers: None) -> None:
    failed = _ended(_fan_out({"count": 6, "fail": [1, 4]}).run_id)
    assert failed.state == "failed"
    first = TaskHistory.objects.filter(parent_run_id=failed.id)
    wait_for(lambda: not first.filter(state__in=("pending", "active", "cancelling")).exists())
    completed = set(first.filter(state="completed").values_list("id", flat=True))
    valkey.client().delete(FAILING)  # what failed them is fixed
    resumed = rerun(failed.id, actor="tester", reuse=True)
    run = _ended(resumed.run_id)
    assert run.state == "completed", run.error
    again = TaskHistory.objects.filter(parent_run_id=resumed.run_id)
    assert again.count() == 6 - len(completed)
    assert {c.input["n"] for c in again} >= {1, 4}
    (waited,) = _waited()
    assert waited["states"] == {"completed": 6} and waited["sum"] == sum(range(6))
    assert run.result["collections"]["children"] == 6


@pytest.mark.parametrize("on_failure", ["continue", "fail_parent"])
def test_a_wake_the_release_lost_is_the_stalled_pipeline_recoverys(on_failure: str) -> None:
    with worker_process(QUEUES, concurrency=4, name="children-lost-wake"):
        handle = _fan_out({"count": 3, "fail": [1], "on_failure": on_failure})
        batches = RunBatch.objects.filter(parent_run_id=handle.run_id)
        wait_for(lambda: batches.exclude(done_at=None).exists(), timeout=30)
        # The release marked it and died before waking the parent.
        batches.update(released_at=timezone.now())
        config = settings.CONFIG
        settings.CONFIG = dataclasses.replace(config, pipeline_recover_after_s=0)
        try:
            wait_for(lambda: not batches.filter(open__gt=0).exists() or on_failure != "continue")
            reconciler = Reconciler()
            assert reconciler.tick().chores["pipelines"] == 1
            reconciler.release()
        finally:
            settings.CONFIG = config
        run = _ended(handle.run_id)
    if on_failure == "continue":
        assert run.state == "completed", run.error
        assert _waited()[0]["states"] == {"completed": 2, "failed": 1}
    else:
        assert (run.state, run.error["kind"]) == ("failed", "child_failed")
        assert _waited() == []


def test_continue_runs_the_waiting_stage_and_it_sees_the_failure(workers: None) -> None:
    handle = start_run(
        "test-fan-out", {"count": 5, "fail": [2], "on_failure": "continue"}, trigger=TriggerKind.API
    )
    run = _ended(handle.run_id)
    assert run.state == "completed", run.error
    (waited,) = _waited()
    assert waited["states"] == {"completed": 4, "failed": 1}


def test_a_plain_handler_spawns_with_its_end_and_a_failed_one_spawns_nothing(
    workers: None,
) -> None:
    plain = _ended(start_run("test-spawner", {"count": 3}, trigger=TriggerKind.API).run_id)
    assert plain.state == "completed", plain.error
    children = TaskHistory.objects.filter(parent_run_id=plain.id)
    assert sorted(children.values_list("id", flat=True)) == sorted(plain.result["children"])
    assert {c.priority for c in children} == {5}
    assert all("stage" not in c.trigger for c in children)
    wait_for(lambda: children.filter(state="completed").count() == 3)
    (batch,) = RunBatch.objects.filter(parent_run_id=plain.id)
    assert batch.parent_stage == ""
    failed = start_run("test-spawner", {"count": 3, "then_fail": True}, trigger=TriggerKind.API)
    assert _ended(failed.run_id).state == "failed"
    assert not TaskHistory.objects.filter(parent_run_id=failed.run_id).exists()
    assert not RunBatch.objects.filter(parent_run_id=failed.run_id).exists()


def test_a_bad_child_input_fails_the_step_and_writes_nothing(workers: None) -> None:
    handle = start_run(
        "test-fan-out", {"count": 3, "fail": [], "grandchildren": -1}, trigger=TriggerKind.API
    )
    run = _ended(handle.run_id)
    assert run.state == "failed"
    assert "spawn: child 0 of test-child: field grandchildren" in run.error["message"]
    assert not TaskHistory.objects.filter(parent_run_id=handle.run_id).exists()
    assert not RunBatch.objects.filter(parent_run_id=handle.run_id).exists()


def test_children_spawn_their_own_and_a_cancel_reaches_every_level(workers: None) -> None:
    handle = _fan_out({"count": 2, "grandchildren": 2, "on_failure": "continue"})
    run = _ended(handle.run_id)
    assert run.state == "completed", run.error
    children = list(TaskHistory.objects.filter(parent_run_id=handle.run_id))
    grandchildren = TaskHistory.objects.filter(parent_run_id__in=[c.id for c in children])
    wait_for(lambda: grandchildren.filter(state="completed").count() == 4)

    # Two levels of fan-outs, the grandchildren slow: the parent waits for its children, each
    # child for its own.
    slow = _fan_out({"count": 2, "nested": 2, "seconds": 20, "on_failure": "continue"})
    children_of = TaskHistory.objects.filter(parent_run_id=slow.run_id)
    wait_for(lambda: children_of.count() == 2)
    grand = TaskHistory.objects.filter(parent_run_id__in=children_of.values("id"))
    wait_for(lambda: grand.filter(state="active").count() >= 2, timeout=30)
    _seen_as_a_tree(slow.run_id, 2)
    request_cancel(slow.run_id, actor="tester")
    assert _ended(slow.run_id).state == "cancelled"
    wait_for(lambda: set(children_of.values_list("state", flat=True)) == {"cancelled"}, timeout=30)
    wait_for(lambda: set(grand.values_list("state", flat=True)) == {"cancelled"}, timeout=30)
    assert grand.count() == 4


def test_a_stage_that_ends_after_its_runs_cancel_writes_no_children(workers: None) -> None:
    handle = _fan_out({"count": 3, "linger": 2, "on_failure": "continue"})
    wait_for(lambda: TaskHistory.objects.get(id=handle.run_id).stages.get("scan") == "active")
    request_cancel(handle.run_id, actor="tester")
    run = _ended(handle.run_id)
    assert run.state == "cancelled"
    assert run.stages["scan"] == "completed"  # it ended as it could, without its children
    assert not TaskHistory.objects.filter(parent_run_id=handle.run_id).exists()


def test_the_reconciler_cancels_the_live_children_of_an_ended_parent(workers: None) -> None:
    handle = _fan_out({"count": 3, "seconds": 30, "on_failure": "continue"})
    children = TaskHistory.objects.filter(parent_run_id=handle.run_id)
    wait_for(lambda: children.filter(state="active").exists(), timeout=30)
    # The parent ended without reaching its children (a crash between, say).
    TaskHistory.objects.filter(id=handle.run_id).update(state="failed")
    reconciler = Reconciler()
    assert reconciler.tick().chores["children"] == 3
    reconciler.release()
    wait_for(lambda: set(children.values_list("state", flat=True)) == {"cancelled"}, timeout=30)


def _seen_as_a_tree(run_id: str, children: int) -> None:
    """The run's page and the API show its children's progress, the runs list filters by
    parent, and /metrics counts them live."""
    user = operator()
    client = Client(headers={"Authorization": f"Bearer {tokens.issue(user)[1]}"})
    detail = client.get(f"/api/v1/runs/{run_id}").json()
    (batch,) = detail["children"]
    says = f"0 of {children} done"
    assert (batch["stage"], batch["total"], batch["says"]) == ("scan", children, says)
    listed = client.get("/api/v1/runs", {"parent": run_id}).json()["items"]
    assert len(listed) == children and {i["parent_run_id"] for i in listed} == {run_id}
    assert {i["batch_id"] for i in listed} == {batch["batch_id"]}
    assert client.get(f"/api/v1/batches/{batch['batch_id']}").json()["total"] == children
    assert scrape()[("lumastra_live_children", (("of", "parent"),))] >= children
    client.force_login(user)
    page = client.get(
        reverse("admin:orchestrator_taskhistory_change", args=[run_id])
    ).content.decode()
    assert says in page and f"?parent={run_id}" in page
    changelist = reverse("admin:orchestrator_taskhistory_changelist")
    rows = client.get(changelist, {"parent": run_id}).content.decode()
    listed_ids = TaskHistory.objects.filter(parent_run_id=run_id).values_list("id", flat=True)
    assert all(child_id in rows for child_id in listed_ids)
    assert reverse("admin:orchestrator_taskhistory_change", args=[run_id]) not in rows
