"""Bulk starts (`start_runs`, `POST /runs:batch`): each start judged on its own, one INSERT and
one publish for the batch, all or nothing only when asked."""

from __future__ import annotations

import pytest
from django.test import Client

from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from orchestrator.runs.batch import MAX_BATCH, Result, start_runs
from orchestrator.runs.batches import StartRequest
from orchestrator.runs.start import start_run
from orchestrator.stores import broker
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.round_trips import recording
from tests.support.users import account, operator

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-starts"  # no shared worker takes its queue
NOOP_QUEUE = "task.t.test-starts"


@pytest.fixture(autouse=True)
def _empty_broker() -> object:
    yield
    empty_queues(NOOP_QUEUE)


def _client(user: object | None = None) -> Client:
    token = tokens.issue(user or operator(), "batch")[1]  # type: ignore[arg-type]
    return Client(headers={"Authorization": f"Bearer {token}"})


def _post(client: Client, body: object) -> object:
    return client.post("/api/v1/runs:batch", body, content_type="application/json")


def test_a_thousand_starts_with_three_refused_insert_997_rows_and_all_complete() -> None:
    refused_at = {10: {"task": "no-such-task"}, 500: {"task": "test-fail", "input": {"how": 7}}}
    runs = [refused_at.get(i, {"task": TASK}) for i in range(999)]
    runs.append({"task": TASK, "priority": 4})  # not a priority step
    before = TaskHistory.objects.count()
    client = _client()

    answer = _post(client, {"runs": runs})

    # The last start's priority is refused by the request's own model: the whole request is.
    assert answer.status_code == 422  # type: ignore[attr-defined]
    assert TaskHistory.objects.count() == before

    runs[-1] = {"task": "test-fail", "input": {"how": "permanent", "extra": 1}}
    with recording() as recorded:
        answer = _post(client, {"runs": runs})

    assert answer.status_code == 200, answer.content  # type: ignore[attr-defined]
    body = answer.json()  # type: ignore[attr-defined]
    assert body["counts"]["started"] == 997
    assert body["counts"]["refused"] == 3
    by_index = {item["index"]: item for item in body["items"]}
    assert by_index[10]["code"] == "unknown_task"
    assert by_index[10]["status"] == 404
    assert by_index[500]["code"] == "invalid_input"
    assert by_index[500]["errors"][0]["loc"][:5] == ["body", "batch", "runs", 500, "input"]
    assert by_index[999]["code"] == "invalid_input"
    assert TaskHistory.objects.count() == before + 997
    # One INSERT for the batch, one round trip for its live hashes, one for its messages.
    inserts = [e for e in recorded.events if "INSERT INTO task_history " in e.what]
    assert len(inserts) == 1
    seeds = [e for e in recorded.events if "seed_run" in e.what]
    assert [e.commands for e in seeds] == [997]  # each counts its run published, too
    pushes = [e for e in recorded.events if e.store == "broker" and "LPUSH" in e.what]
    assert [e.commands for e in pushes] == [997]
    assert broker.depth([NOOP_QUEUE]) == 997

    started = [item["run_id"] for item in body["items"] if item["result"] == "started"]
    with worker_process([NOOP_QUEUE], concurrency=2, name="batch"):
        wait_for(
            lambda: TaskHistory.objects.filter(id__in=started, state="completed").count() == 997,
            timeout=120,
        )


def test_an_atomic_batch_with_a_refusal_writes_nothing_and_gives_quota_back() -> None:
    requests = [StartRequest("test-quota", {"how": "permanent"}) for _ in range(2)]
    requests.append(StartRequest("test-fail", {"how": "sideways"}))
    before = TaskHistory.objects.count()

    outcomes = start_runs(requests, atomic=True)

    assert [o.result for o in outcomes] == [Result.NOT_STARTED, Result.NOT_STARTED, Result.REFUSED]
    assert TaskHistory.objects.count() == before
    # The quota (3 a day) was given back: three starts still fit today.
    again = start_runs([StartRequest("test-quota", {"how": "permanent"}) for _ in range(4)])
    assert [o.result for o in again] == [Result.STARTED] * 3 + [Result.REFUSED]
    assert again[3].code == "quota_exceeded"
    assert again[3].http_status == 429


def test_the_api_answers_an_atomic_refusal_with_409_naming_each_refused_start() -> None:
    before = TaskHistory.objects.count()
    answer = _post(
        _client(),
        {"atomic": True, "runs": [{"task": TASK}, {"task": "nope"}, {"task": TASK}]},
    )

    assert answer.status_code == 409  # type: ignore[attr-defined]
    body = answer.json()  # type: ignore[attr-defined]
    assert body["code"] == "batch_refused"
    assert [e["loc"] for e in body["errors"]] == [["body", "batch", "runs", 1]]
    assert body["errors"][0]["type"] == "unknown_task"
    assert TaskHistory.objects.count() == before
    assert broker.depth([NOOP_QUEUE]) == 0


def test_idempotency_keys_join_a_live_run_and_an_earlier_start_of_the_same_batch() -> None:
    live = start_run(TASK, {}, trigger=TriggerKind.MANUAL, idempotency_key="k-live")

    outcomes = start_runs(
        [
            StartRequest(TASK, idempotency_key="k-live"),
            StartRequest(TASK, idempotency_key="k-new"),
            StartRequest(TASK, idempotency_key="k-new"),
        ]
    )

    assert outcomes[0].result is Result.JOINED
    assert outcomes[0].run_id == live.run_id
    assert outcomes[1].result is Result.STARTED
    assert outcomes[2].result is Result.JOINED
    assert outcomes[2].run_id == outcomes[1].run_id
    assert TaskHistory.objects.filter(trigger__idempotencyKey="k-new").count() == 1


def test_stop_at_refusal_leaves_the_rest_untried() -> None:
    outcomes = start_runs(
        [StartRequest("test-quota", {"how": "permanent"}) for _ in range(5)],
        stop_at_refusal=True,
    )

    assert [o.result for o in outcomes] == [Result.STARTED] * 3 + [
        Result.REFUSED,
        Result.NOT_STARTED,
    ]


def test_a_batch_over_the_limit_is_a_422() -> None:
    answer = _post(_client(), {"runs": [{"task": TASK}] * (MAX_BATCH + 1)})

    assert answer.status_code == 422  # type: ignore[attr-defined]
    assert "runs" in answer.content.decode()  # type: ignore[attr-defined]


def test_who_may_start_a_batch() -> None:
    body = {"runs": [{"task": TASK}]}

    assert _post(Client(), body).status_code == 401  # type: ignore[attr-defined]
    assert _post(_client(account("viewer", Access.VIEW)), body).status_code == 403  # type: ignore[attr-defined]
    assert _post(_client(account("nobody")), body).status_code == 403  # type: ignore[attr-defined]
    assert _post(_client(), body).status_code == 200  # type: ignore[attr-defined]


def test_a_start_that_was_refused_is_never_joined_by_a_later_one_with_its_key() -> None:
    outcomes = start_runs(
        [
            StartRequest("test-unique-quota", {"key": "a"}, idempotency_key="qa"),
            StartRequest("test-unique-quota", {"key": "b"}, idempotency_key="qb"),
            StartRequest("test-unique-quota", {"key": "b"}, idempotency_key="qb"),
        ]
    )

    assert [o.result for o in outcomes] == [Result.STARTED, Result.REFUSED, Result.REFUSED]
    assert outcomes[2].run_id is None  # not the id of a run that was never written
    assert TaskHistory.objects.filter(task_id="test-unique-quota").count() == 1
