"""Starts that coalesce (issue 39): a debounced task's burst of starts makes one run, with the
last start's input, due `period_s` after the last start and never later than `max_wait_s`
after the first; through Python, `POST /runs` and `POST /runs:batch` alike, with a real worker
running the one run the due loop releases."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.runs import coalesce
from orchestrator.runs.start import prepare, start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.metrics import scrape
from tests.support.runs import due_loop
from tests.support.task_defs import DEBOUNCED_KEY
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-debounced"  # Debounce(period_s=1, max_wait_s=3), identity: the input's key
QUEUE = f"task.t.{TASK}"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    valkey.client().delete(DEBOUNCED_KEY)
    empty_queues(QUEUE)
    yield
    valkey.client().delete(DEBOUNCED_KEY)


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})


@pytest.mark.worker
def test_a_burst_of_starts_makes_one_run_with_the_last_input_within_max_wait() -> None:
    with worker_process([QUEUE], concurrency=1, name="debounce"), due_loop():
        began = time.monotonic()
        first = start_run(TASK, {"key": "season-1", "n": 0}, trigger=TriggerKind.EVENT)
        assert not first.debounced
        handles = []
        # 99 more starts 25 ms apart, within 2.5 s (fewer on a loaded machine): never a
        # second's quiet, so the run waits until max_wait_s (3 s) after the first start.
        for n in range(1, 100):
            if time.monotonic() - began > 2.5:
                break
            time.sleep(0.025)
            start = start_run(TASK, {"key": "season-1", "n": n}, trigger=TriggerKind.EVENT)
            handles.append(start)
        last = len(handles)
        assert all(h.debounced and h.run_id == first.run_id for h in handles)
        other = start_run(TASK, {"key": "season-2", "n": 0}, trigger=TriggerKind.EVENT)
        assert not other.debounced  # another identity waits on its own
        wait_for(lambda: valkey.client().llen(DEBOUNCED_KEY) == 2, timeout=30)

    done = sorted(valkey.client().lrange(DEBOUNCED_KEY, 0, -1))
    assert done == [f"season-1:{last}", "season-2:0"]
    assert TaskHistory.objects.filter(task_id=TASK).count() == 2
    run = TaskHistory.objects.get(id=first.run_id)
    assert run.state == "completed" and run.input == {"key": "season-1", "n": last}
    assert run.trigger["debounced"] == last
    # Due at max_wait_s after the first start at the latest, though starts kept coming:
    # picked up within a poll of the due loop and a pickup of that.
    assert run.started_at is not None
    assert run.started_at - run.created_at < timedelta(seconds=4)


def test_the_api_and_a_batch_answer_debounced_naming_the_waiting_run(client: Client) -> None:
    def post(path: str, body: object) -> object:
        return client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")

    first = post("/runs", {"task": TASK, "input": {"key": "a", "n": 1}})
    assert first.status_code == 202 and first.json()["outcome"] == "started"  # type: ignore[attr-defined]
    run_id = first.json()["run_id"]  # type: ignore[attr-defined]
    second = post("/runs", {"task": TASK, "input": {"key": "a", "n": 2}})
    body = second.json()  # type: ignore[attr-defined]
    assert second.status_code == 200  # type: ignore[attr-defined]
    assert (body["outcome"], body["run_id"], body["state"]) == ("debounced", run_id, "pending")
    held = client.get(f"/api/v1/runs/{run_id}").json()["held"]
    due = TaskHistory.objects.get(id=run_id).not_before
    assert held["by"] == "debounce" and held["says"] == f"debounced until {due:%H:%M:%S} UTC"

    starts = [
        {"task": TASK, "input": {"key": k, "n": n}} for k, n in (("a", 3), ("b", 1), ("b", 2))
    ]
    batch = post("/runs:batch", {"runs": starts}).json()  # type: ignore[attr-defined]
    results = [(item["result"], item["run_id"]) for item in batch["items"]]
    assert results[0] == ("debounced", run_id)
    assert results[1][0] == "started" and results[2] == ("debounced", results[1][1])
    inputs = dict(TaskHistory.objects.filter(task_id=TASK).values_list("id", "input"))
    assert inputs == {run_id: {"key": "a", "n": 3}, results[1][1]: {"key": "b", "n": 2}}


def test_a_throttled_identity_makes_one_run_per_period(client: Client) -> None:
    throttled = "test-throttled"  # Throttle(period_s=2); its identity: the input's digest
    answers = []
    began = time.monotonic()
    while time.monotonic() - began < 9.8:
        answers.append(start_run(throttled, {}, trigger=TriggerKind.EVENT))
        time.sleep(0.1)
    made = [a for a in answers if a.next_start_at is None]
    assert 4 <= len(made) <= 5  # at most one per 2 s over 10 s
    assert TaskHistory.objects.filter(task_id=throttled).count() == len(made)
    met = answers[1]
    assert met.next_start_at is not None and met.run_id == answers[0].run_id

    # Over the API: the run met, and when the next may start.
    time.sleep(2.1)
    client.post("/api/v1/runs", json.dumps({"task": throttled}), content_type="application/json")
    answer = client.post(
        "/api/v1/runs", json.dumps({"task": throttled}), content_type="application/json"
    ).json()
    assert answer["outcome"] == "throttled" and answer["next_start_at"] is not None
    batch = client.post(
        "/api/v1/runs:batch",
        json.dumps({"runs": [{"task": throttled}]}),
        content_type="application/json",
    ).json()
    item = batch["items"][0]
    assert item["result"] == "throttled" and item["run_id"] == answer["run_id"]
    assert item["next_start_at"] is not None


def test_two_first_starts_at_once_make_one_run() -> None:
    barrier = threading.Barrier(2)
    answers: list[object] = []

    def start(n: int) -> None:
        try:
            barrier.wait(5)
            answers.append(start_run(TASK, {"key": "raced", "n": n}, trigger=TriggerKind.EVENT))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(answers) == 2
    assert TaskHistory.objects.filter(task_id=TASK).count() == 1
    run = TaskHistory.objects.get(task_id=TASK)
    assert {a.run_id for a in answers} == {run.id}  # type: ignore[attr-defined]
    assert sorted(a.debounced for a in answers) == [False, True]  # type: ignore[attr-defined]


def test_start_outcomes_are_counted_for_metrics(client: Client) -> None:
    store = valkey.client()
    store.delete(*store.keys("task:throttle:test-throttled:*") or ["none"])  # a new period
    counted = ("lumastra_start_outcomes_total",)
    before = {k: v for k, v in scrape().items() if k[0] in counted}
    start_run(TASK, {"key": "m", "n": 1}, trigger=TriggerKind.EVENT)  # a delayed start: started
    start_run(TASK, {"key": "m", "n": 2}, trigger=TriggerKind.EVENT)  # debounced
    start_run("test-throttled", {}, trigger=TriggerKind.EVENT)  # started, published at once
    start_run("test-throttled", {}, trigger=TriggerKind.EVENT)  # throttled
    starts = [{"task": "test-throttled"}, {"task": TASK, "input": {"key": "m", "n": 3}}]
    client.post("/api/v1/runs:batch", json.dumps({"runs": starts}), content_type="application/json")

    after = scrape()

    def added(task: str, outcome: str) -> float:
        key = ("lumastra_start_outcomes_total", (("outcome", outcome), ("task", task)))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert added(TASK, "started") == 1
    assert added(TASK, "debounced") == 2  # one of them in the batch
    assert added("test-throttled", "started") == 1
    assert added("test-throttled", "throttled") == 2


def test_a_first_start_that_meets_a_waiting_run_joins_it_in_its_insert() -> None:
    # The race two first starts run: the second's INSERT meets the first's waiting run (the
    # partial unique index) and gives it its input in the same statement.
    waiting = start_run(TASK, {"key": "upsert", "n": 1}, trigger=TriggerKind.EVENT)
    second = prepare(TASK, {"key": "upsert", "n": 2}, trigger=TriggerKind.EVENT)
    joined = coalesce.insert_or_join(second)
    assert joined is not None and joined.run_id == waiting.run_id
    row = TaskHistory.objects.get(task_id=TASK)  # one row: nothing inserted
    assert (row.input["n"], row.trigger["debounced"]) == (2, 1)
    third = prepare(TASK, {"key": "another", "n": 1}, trigger=TriggerKind.EVENT)
    assert coalesce.insert_or_join(third) is None  # no waiting run of its identity: inserted
    assert TaskHistory.objects.filter(task_id=TASK).count() == 2
