"""Batches from outside (issue 40): `POST /runs:batch` with `batch` callbacks. Once every run of
the batch has ended, `on_complete` starts once with the counts by state and the batch id;
`on_success` only when all completed. `GET /batches/{id}` answers the runs by state and the
callbacks' runs. Real workers, the leader's `batches` loop as `orchestrator.loops` runs it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import RunBatch, TaskHistory
from orchestrator.runs.batch import start_runs
from orchestrator.runs.batches import Batch, StartRequest
from orchestrator.stores import valkey
from tests.support.child_defs import CALLBACK_RECORD, FAILING
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.runs import batches_loop
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

QUEUES = ["task.t.test-child", "task.t.test-batch-callback"]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    valkey.client().delete(CALLBACK_RECORD)
    valkey.client().set(FAILING, 1)
    empty_queues(*QUEUES)
    yield
    valkey.client().delete(CALLBACK_RECORD)


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})


def _callbacks() -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in valkey.client().lrange(CALLBACK_RECORD, 0, -1)]


def _body(fail: set[int]) -> dict[str, Any]:
    return {
        "runs": [{"task": "test-child", "input": {"n": n, "fail": n in fail}} for n in range(200)],
        "batch": {
            "on_complete": {"task": "test-batch-callback", "input": {"label": "complete"}},
            "on_success": {"task": "test-batch-callback", "input": {"label": "success"}},
        },
    }


def test_on_complete_runs_once_with_the_counts_and_on_success_not_after_a_failure(
    client: Client,
) -> None:
    answer = client.post("/api/v1/runs:batch", _body({17}), content_type="application/json")
    assert answer.status_code == 200, answer.content
    batch_id = answer.json()["batch_id"]
    assert answer.json()["counts"]["started"] == 200
    with worker_process(QUEUES, concurrency=4, name="batches"), batches_loop():
        wait_for(lambda: _callbacks(), timeout=90)
        wait_for(lambda: RunBatch.objects.get(id=batch_id).callbacks, timeout=10)
        callback_run = RunBatch.objects.get(id=batch_id).callbacks["on_complete"]
        wait_for(lambda: TaskHistory.objects.filter(id=callback_run, state="completed").exists())
    assert _callbacks() == [
        {"label": "complete", "batch": batch_id, "counts": {"completed": 199, "failed": 1}}
    ]
    state = client.get(f"/api/v1/batches/{batch_id}").json()
    assert state["total"] == 200 and state["ended"] == 200
    assert state["by_state"] == {"completed": 199, "failed": 1}
    assert set(state["callbacks"]) == {"on_complete"}  # on_success did not start
    assert TaskHistory.objects.filter(task_id="test-batch-callback").count() == 1


def test_on_success_runs_when_every_run_completed() -> None:
    callback = StartRequest("test-batch-callback", {"label": "success"})
    batch = Batch(on_complete=callback, on_success=callback)
    outcomes = start_runs([StartRequest("test-child", {"n": n}) for n in range(5)], batch=batch)
    assert {o.result.value for o in outcomes} == {"started"}
    with worker_process(QUEUES, concurrency=2, name="batches"), batches_loop():
        wait_for(lambda: len(_callbacks()) == 2, timeout=60)
    assert sorted(c["counts"]["completed"] for c in _callbacks()) == [5, 5]
    assert set(RunBatch.objects.get(id=batch.id).callbacks) == {"on_complete", "on_success"}


def test_bad_callbacks_and_unknown_batches_are_refused(client: Client) -> None:
    body = _body(set())
    body["batch"]["on_complete"]["input"] = {"label": 7}
    answer = client.post("/api/v1/runs:batch", body, content_type="application/json")
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"][:5] == [
        "body",
        "batch",
        "batch",
        "on_complete",
        "input",
    ]
    body["batch"]["on_complete"] = {"task": "no-such-task"}
    answer = client.post("/api/v1/runs:batch", body, content_type="application/json")
    assert answer.status_code == 404
    assert not TaskHistory.objects.filter(task_id="test-child").exists()
    assert client.get("/api/v1/batches/batch_01ARZ3NDEKTSV4RRFFQ69G5FAV").status_code == 404
    assert client.get("/api/v1/batches/nonsense").status_code == 404
