"""Named limits shared across tasks (issue 39): `define_limit`, taken at pickup by the tasks
that name them (`limits=`) and inside handlers (`ctx.limit`); cluster-wide, per key. Real
workers; times are the handlers' own, by Valkey's clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.runs.batch import start_runs
from orchestrator.runs.batches import StartRequest
from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tasks import define_limit, define_task
from tasks.errors import ManifestError
from tasks.registry import Registry, RegistryError
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.task_defs import LIMITED_KEY, KeyedInput
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

QUEUES = [
    "task.t.test-rated-a",
    "task.t.test-rated-b",
    "task.t.test-in-limit",
    "task.t.test-limited-pickup",
]
RATE, SPAN_MS, OVER_MS = 40, 10_000, 60_000


def _forget() -> None:
    client = valkey.client()
    client.delete(LIMITED_KEY, *client.keys("limit:test-*"))


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    _forget()
    empty_queues(*QUEUES)
    yield
    _forget()


def _events(what: str) -> list[dict[str, Any]]:
    entries = [json.loads(e) for e in valkey.client().lrange(LIMITED_KEY, 0, -1)]
    return [e for e in entries if e["what"] == what]


@pytest.mark.worker
def test_two_tasks_share_one_rate_and_use_it() -> None:
    requests = [
        StartRequest(task, {"library": "x", "n": n})
        for n in range(150)
        for task in ("test-rated-a", "test-rated-b")
    ]
    assert all(o.result == "started" for o in start_runs(requests))
    with worker_process(QUEUES[:2], concurrency=4, name="shared-rate"):
        wait_for(lambda: _events("start"), timeout=30)
        first = min(e["at_ms"] for e in _events("start"))
        wait_for(lambda: max(e["at_ms"] for e in _events("start")) >= first + OVER_MS, 120)
    starts = sorted(e["at_ms"] for e in _events("start") if e["at_ms"] < first + OVER_MS)
    busiest = max(sum(1 for t in starts if s <= t < s + SPAN_MS) for s in starts)
    assert busiest <= RATE, f"{busiest} starts in one {SPAN_MS} ms window"
    assert len(starts) >= 0.9 * RATE * OVER_MS / SPAN_MS, f"{len(starts)} starts in 60 s"
    ran = TaskHistory.objects.filter(id__in=[e["run"] for e in _events("start")])
    tasks = set(ran.values_list("task_id", flat=True))
    assert tasks == {"test-rated-a", "test-rated-b"}  # the budget is the two tasks' together
    assert not TaskHistory.objects.filter(state="failed").exists()


@pytest.mark.worker
def test_a_handlers_limit_holds_one_run_per_key_at_once() -> None:
    with worker_process(QUEUES[2:], concurrency=3, name="in-limit"):
        for n, library in enumerate(("lib-1", "lib-1", "lib-2")):
            start_run(
                "test-in-limit",
                {"library": library, "n": n, "seconds": 0.6},
                trigger=TriggerKind.EVENT,
            )
        wait_for(lambda: len(_events("exit")) == 3, timeout=30)
    spans = {
        e["run"]: (e["library"], e["at_ms"], x["at_ms"])
        for e in _events("enter")
        for x in _events("exit")
        if x["run"] == e["run"]
    }
    lib1 = sorted((start, end) for lib, start, end in spans.values() if lib == "lib-1")
    assert lib1[1][0] >= lib1[0][1], "one run of lib-1 at a time"
    lib2 = next((start, end) for lib, start, end in spans.values() if lib == "lib-2")
    assert lib2[0] < lib1[0][1], "lib-2 ran beside lib-1's first"


@pytest.mark.worker
def test_a_handler_that_waits_past_its_bound_is_put_back_unspent() -> None:
    with worker_process(QUEUES[2:], concurrency=2, name="impatient"):
        holder = start_run(
            "test-in-limit",
            {"library": "a", "n": -1, "seconds": 2.0},
            trigger=TriggerKind.EVENT,
        )
        wait_for(lambda: _events("enter"), timeout=30)
        waiter = start_run(
            "test-in-limit",
            {"library": "b", "n": -2, "seconds": 0.0},
            trigger=TriggerKind.EVENT,
        )

        def put_back() -> bool:
            row = TaskHistory.objects.get(id=waiter.run_id)
            return row.state == "pending" and (row.error or {}).get("kind") == "limited"

        wait_for(put_back, timeout=10)
        assert TaskHistory.objects.get(id=waiter.run_id).attempts == 0  # not spent
        wait_for(
            lambda: (
                TaskHistory.objects.filter(
                    id__in=[holder.run_id, waiter.run_id], state="completed"
                ).count()
                == 2
            ),
            timeout=30,
        )
    assert TaskHistory.objects.get(id=waiter.run_id).attempts == 1


def test_bad_declarations_name_their_field() -> None:
    def lost(ctx: object, params: object) -> None:
        return None

    with pytest.raises(RegistryError, match=r"field 'limits': 'nowhere' is not a declared limit"):
        Registry([define_task(id="lost", resource_class="io", execute=lost, limits=("nowhere",))])
    with pytest.raises(ManifestError, match="field 'rate'"):
        define_limit("bad", rate="40 per 10s")
    with pytest.raises(ManifestError, match="field 'rate'"):
        define_limit("nothing")  # neither a rate nor a concurrency
    disk = define_limit("disk", concurrency=1, key=lambda params: params.library)
    task = define_task(
        id="keyed-disk", resource_class="io", execute=lost, input_model=KeyedInput, limits=("disk",)
    )
    assert Registry([task], limits=[disk]).limits["disk"] is disk


def test_a_key_function_that_fails_at_start_is_a_422_naming_the_limit() -> None:
    client = Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})
    answer = client.post(
        "/api/v1/runs",
        json.dumps({"task": "test-rated-by-key", "input": {"library": "", "n": 1}}),
        content_type="application/json",
    )
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"][-3:] == ["limits", "test-keyed-rate", "key"]
    assert not TaskHistory.objects.filter(task_id="test-rated-by-key").exists()


@pytest.mark.worker
def test_a_run_waiting_for_a_limit_is_seen_and_operated(admin_client: Client) -> None:
    client = Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})
    with worker_process(QUEUES[3:], concurrency=2, name="limit-seen"):
        first, second = (
            start_run(
                "test-limited-pickup",
                {"library": "x", "n": n, "seconds": 2.5},
                trigger=TriggerKind.EVENT,
            )
            for n in (1, 2)
        )
        wait_for(lambda: _events("start"), timeout=30)
        # Both messages are taken at once (two pool processes): either run may hold the place.
        holder = _events("start")[0]["run"]
        waiting = second.run_id if holder == first.run_id else first.run_id

        def waits() -> dict[str, Any] | None:
            answer = client.get(f"/api/v1/runs/{waiting}").json()
            return answer["held"] if answer["state"] == "pending" else None

        held = wait_for(waits, timeout=10)
        assert held["by"] == "limit" and held["says"] == "waits for limit test-one-at-a-time"
        limits = {item["name"]: item for item in client.get("/api/v1/limits").json()}
        seen = limits["test-one-at-a-time"]
        assert (seen["kind"], seen["concurrency"], seen["tasks"]) == (
            "limit",
            1,
            ["test-limited-pickup"],
        )
        assert seen["keys"] == [
            {"key": "", "in_use": 1, "waiting": 1, "rate_used": None, "turn": None}
        ]
        assert limits["test-shared-rate"]["rate"] == "40/10s"
        assert limits["test-keyed"]["kind"] == "concurrency"  # a task's keyed concurrency
        page = admin_client.get("/admin/orchestrator/taskhistory/limits/")
        assert page.status_code == 200
        assert b'id="limit-test-one-at-a-time"' in page.content
        wait_for(lambda: len(_events("start")) == 2, timeout=30)
    starts = {e["run"]: e["at_ms"] for e in _events("start")}
    assert starts[waiting] >= starts[holder] + 2400  # after the place was freed
    assert TaskHistory.objects.get(id=waiting).attempts == 1
