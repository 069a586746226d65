"""One follow-up after the running run (issue 39): a start of a `while_active="follow_up"` task
that meets the running run of its identity records one follow-up, which later starts give their
input, and which starts once that run ends: completed, put back after a SIGKILL and completed,
or cancelled. Real workers, the due loop as the leader runs it."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.handle import RunHandle
from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.runs import due_loop
from tests.support.task_defs import FOLLOW_UP_GATE, FOLLOW_UP_KEY
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-follow-up"  # identity: the input's key; a handler waits while the gate exists
QUEUE = f"task.t.{TASK}"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    valkey.client().delete(FOLLOW_UP_KEY, FOLLOW_UP_GATE)
    empty_queues(QUEUE)
    yield
    valkey.client().delete(FOLLOW_UP_KEY, FOLLOW_UP_GATE)


def _calls() -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in valkey.client().lrange(FOLLOW_UP_KEY, 0, -1)]


def _start(n: int, key: str = "library-7") -> RunHandle:
    return start_run(TASK, {"key": key, "n": n}, trigger=TriggerKind.EVENT)


def _running(run_id: str, calls: int) -> dict[str, Any]:
    """The handler call number `calls` (from 1), once it has begun, as it recorded itself."""
    wait_for(lambda: len(_calls()) >= calls, timeout=30)
    call = _calls()[calls - 1]
    assert call["run"] == run_id
    return call


def _follow_up_during(first: RunHandle) -> RunHandle:
    """Three starts while `first` runs: one follow-up, with the last start's input."""
    answers = [_start(n) for n in (1, 2, 3)]
    follow_up = answers[0]
    assert all(a.coalesced and a.run_id == follow_up.run_id for a in answers)
    assert follow_up.run_id != first.run_id
    row = TaskHistory.objects.get(id=follow_up.run_id)
    assert (row.state, row.input["n"], row.trigger["waitsFor"]) == ("pending", 3, first.run_id)
    return follow_up


def _ends_then_follows(first: RunHandle, follow_up: RunHandle, first_state: str) -> None:
    wait_for(
        lambda: TaskHistory.objects.filter(id=follow_up.run_id, state="completed").exists(),
        timeout=30,
    )
    ended = TaskHistory.objects.get(id=first.run_id)
    after = TaskHistory.objects.get(id=follow_up.run_id)
    assert ended.state == first_state
    assert after.trigger["follows"] == first.run_id and "waitsFor" not in after.trigger
    assert after.trigger["coalesced"] == 2  # the two starts after the one that recorded it
    assert ended.finished_at is not None and after.started_at is not None
    assert after.started_at >= ended.finished_at  # never beside the run it follows
    assert [c["run"] for c in _calls()].count(follow_up.run_id) == 1
    assert _calls()[-1]["n"] == 3
    assert TaskHistory.objects.filter(task_id=TASK, identity="library-7").count() == 2


@pytest.mark.worker
def test_a_follow_up_starts_once_after_the_run_completes_with_the_latest_input() -> None:
    valkey.client().set(FOLLOW_UP_GATE, 1)
    with worker_process([QUEUE], concurrency=2, name="follow-up"), due_loop():
        first = _start(0)
        assert not first.coalesced
        pending_again = _start(9)  # not running yet: it joins the pending run
        assert pending_again.deduplicated and pending_again.run_id == first.run_id
        _running(first.run_id, 1)
        follow_up = _follow_up_during(first)
        other = _start(0, key="library-8")  # another identity runs beside, unheld
        _running(other.run_id, 2)
        valkey.client().delete(FOLLOW_UP_GATE)
        _ends_then_follows(first, follow_up, "completed")
        # The run followed kept its own input: the later starts' went to the follow-up.
        assert TaskHistory.objects.get(id=first.run_id).input["n"] == 0


@pytest.mark.worker
def test_a_follow_up_waits_for_a_killed_run_put_back_and_completed() -> None:
    valkey.client().set(FOLLOW_UP_GATE, 1)
    with worker_process([QUEUE], concurrency=2, name="follow-up-kill"), due_loop():
        first = _start(0)
        call = _running(first.run_id, 1)
        follow_up = _follow_up_during(first)
        os.kill(call["pid"], signal.SIGKILL)
        _running(first.run_id, 2)  # put back: the same run, its next attempt
        row = TaskHistory.objects.get(id=follow_up.run_id)
        assert row.state == "pending" and row.trigger["waitsFor"] == first.run_id
        valkey.client().delete(FOLLOW_UP_GATE)
        _ends_then_follows(first, follow_up, "completed")
    assert TaskHistory.objects.get(id=first.run_id).attempts == 2


@pytest.mark.worker
def test_a_follow_up_starts_after_the_run_is_cancelled() -> None:
    valkey.client().set(FOLLOW_UP_GATE, 1)
    with worker_process([QUEUE], concurrency=2, name="follow-up-cancel"), due_loop():
        first = _start(0)
        _running(first.run_id, 1)
        follow_up = _follow_up_during(first)
        request_cancel(first.run_id, actor="test")
        wait_for(
            lambda: TaskHistory.objects.filter(id=first.run_id, state="cancelled").exists(),
            timeout=30,
        )
        valkey.client().delete(FOLLOW_UP_GATE)
        _ends_then_follows(first, follow_up, "cancelled")


def test_the_api_and_a_batch_answer_coalesced_naming_the_follow_up() -> None:
    client = Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})
    running = _start(0)
    # As a worker's claim leaves it (no worker takes this queue in this test).
    TaskHistory.objects.filter(id=running.run_id).update(state="active", attempts=1)

    def post(path: str, body: object) -> Any:
        return client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")

    answer = post("/runs", {"task": TASK, "input": {"key": "library-7", "n": 1}})
    body = answer.json()
    assert answer.status_code == 200
    assert (body["outcome"], body["state"]) == ("coalesced", "pending")
    follow_up = body["run_id"]
    held = client.get(f"/api/v1/runs/{follow_up}").json()["held"]
    assert held["by"] == "follow_up" and held["name"] == running.run_id
    assert held["says"] == f"follows up run {running.run_id}: starts when it ends"

    starts = [{"task": TASK, "input": {"key": "library-7", "n": n}} for n in (2, 3)]
    items = post("/runs:batch", {"runs": starts}).json()["items"]
    assert [(i["result"], i["run_id"]) for i in items] == [("coalesced", follow_up)] * 2
    assert TaskHistory.objects.get(id=follow_up).input["n"] == 3

    # The end makes it due, in the same transaction, whichever path writes the end.
    TaskHistory.objects.filter(id=running.run_id).update(state="failed")
    row = TaskHistory.objects.get(id=follow_up)
    assert row.not_before is not None and row.trigger["follows"] == running.run_id
    assert "waitsFor" not in row.trigger
