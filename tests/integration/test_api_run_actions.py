"""The API's run actions beyond a plain cancel and retry, on real workers: kill now of a handler
that ignores the cancel, and a failed pipeline retried fresh or resumed; and what is refused
(a resume of a run that is not a pipeline, a retry of a live run, a bad body), with nothing
written."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name, stage_queue
from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.processes import alive
from tests.support.task_defs import PIPE_CALLS_KEY, SLEEPY_PIDS_KEY
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True)]

SLEEPY = "task.t.test-sleepy"
PIPE = "test-pipe"
# The cancel's escalation would take a minute: only kill now ends the run sooner.
SLOW_ESCALATION = {"LUMASTRA_HEARTBEAT_INTERVAL_S": "1", "LUMASTRA_CANCEL_ESCALATE_S": "60"}


@pytest.fixture(autouse=True)
def _empty_queue() -> None:
    empty_queues(SLEEPY)
    valkey.client().delete(SLEEPY_PIDS_KEY)


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})


def _post(client: Client, path: str, body: Any = None) -> Any:
    data = "" if body is None else json.dumps(body)
    return client.post(f"/api/v1{path}", data, content_type="application/json")


def _state(run_id: str) -> str:
    return TaskHistory.objects.get(id=run_id).state


def _ended(run_id: str) -> TaskHistory | None:
    row = TaskHistory.objects.get(id=run_id)
    return row if row.state in ("completed", "failed", "cancelled") else None


def _stages_run(run_id: str) -> set[str]:
    raw = valkey.client().lrange(PIPE_CALLS_KEY.format(run_id=run_id), 0, -1)
    return {json.loads(call)["stage"] for call in raw}


def _pipe_queues() -> list[str]:
    per_task = settings.CONFIG.per_task_queues
    definition = registry.get()[PIPE]
    stages = {stage_queue(definition, s, per_task) for s in definition.pipeline}
    return sorted({queue_name(definition, per_task), *stages})


@pytest.mark.worker
def test_kill_now_ends_a_handler_that_ignores_the_cancel(client: Client) -> None:
    with worker_process([SLEEPY], concurrency=1, name="api-kill", env=SLOW_ESCALATION):
        deaf = start_run(
            "test-sleepy", {"seconds": 60, "cooperative": False}, trigger=TriggerKind.MANUAL
        )
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, deaf.run_id)))

        # No body: today's cooperative cancel, which this handler does not hear.
        cancelled = _post(client, f"/runs/{deaf.run_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelling"
        time.sleep(1.5)
        assert _state(deaf.run_id) == "cancelling" and alive(pid)

        asked = time.monotonic()
        killed = _post(client, f"/runs/{deaf.run_id}/cancel", {"kill": True})

        assert killed.status_code == 200, killed.content
        assert killed.json() == {"run_id": deaf.run_id, "state": "cancelling"}
        wait_for(lambda: _state(deaf.run_id) == "cancelled", timeout=10)
        wait_for(lambda: not alive(pid), timeout=10)
        assert time.monotonic() - asked < 15  # not the 60 s escalation


@pytest.mark.worker
def test_a_failed_pipeline_is_resumed_or_retried_fresh_as_asked(client: Client) -> None:
    key = f"test:pipe:api:{uuid.uuid4().hex}"
    with worker_process(_pipe_queues(), concurrency=2, name="api-pipe"):
        original = start_run(
            PIPE, {"skip_right": True, "final_needs_key": key}, trigger=TriggerKind.MANUAL
        ).run_id
        failed = wait_for(lambda: _ended(original), timeout=30)
        assert failed.state == "failed" and failed.stages["final"] == "failed"
        valkey.client().set(key, "1")  # what made `final` fail is fixed

        resumed = _post(client, f"/runs/{original}/retry", {"mode": "resume"})
        fresh = _post(client, f"/runs/{original}/retry", {"mode": "fresh"})

        assert resumed.status_code == fresh.status_code == 202, (resumed.content, fresh.content)
        resumed_id, fresh_id = resumed.json()["run_id"], fresh.json()["run_id"]
        for run_id in (resumed_id, fresh_id):
            row = wait_for(lambda run_id=run_id: _ended(run_id), timeout=30)
            assert row.state == "completed", row.error
            assert row.trigger["retryOf"] == original and row.priority == 1
    # Resumed: only the failed stage ran again. Fresh: every stage that applies.
    assert _stages_run(resumed_id) == {"final"}
    assert TaskHistory.objects.get(id=resumed_id).steps["probe"]["reused_from"] == original
    assert _stages_run(fresh_id) == {"probe", "left", "final"}
    assert "reused_from" not in TaskHistory.objects.get(id=fresh_id).steps.get("probe", {})


def test_a_resume_of_a_run_that_is_not_a_pipeline_is_refused(client: Client) -> None:
    run_id = start_run("test-sleepy", {"seconds": 5}, trigger=TriggerKind.MANUAL).run_id
    assert _post(client, f"/runs/{run_id}/cancel").json()["state"] == "cancelled"
    runs = TaskHistory.objects.count()

    refused = _post(client, f"/runs/{run_id}/retry", {"mode": "resume"})

    assert refused.status_code == 409
    assert "not a pipeline run" in refused.json()["detail"]
    assert "nothing was started" in refused.json()["detail"]
    assert TaskHistory.objects.count() == runs
    # Fresh, or no body at all, reruns it.
    assert _post(client, f"/runs/{run_id}/retry", {"mode": "fresh"}).status_code == 202
    assert _post(client, f"/runs/{run_id}/retry").status_code == 202
    assert TaskHistory.objects.count() == runs + 2


def test_a_retry_of_a_live_run_is_refused_in_either_mode(client: Client) -> None:
    run_id = start_run("test-sleepy", {"seconds": 5}, trigger=TriggerKind.MANUAL).run_id
    runs = TaskHistory.objects.count()

    for body in (None, {"mode": "fresh"}, {"mode": "resume"}):
        refused = _post(client, f"/runs/{run_id}/retry", body)
        assert refused.status_code == 409, body
        assert "only failed or cancelled runs are retried" in refused.json()["detail"]
    assert TaskHistory.objects.count() == runs


@pytest.mark.parametrize(
    ("action", "body", "field"),
    [
        ("cancel", {"kill": "yes"}, "kill"),
        ("cancel", {"kill": 1}, "kill"),
        ("cancel", {"now": True}, "now"),
        ("retry", {"mode": "again"}, "mode"),
        ("retry", {"mode": "fresh", "reuse": True}, "reuse"),
    ],
)
def test_a_bad_body_is_a_422_naming_its_field_and_changes_nothing(
    client: Client, action: str, body: dict[str, Any], field: str
) -> None:
    run_id = start_run("test-sleepy", {"seconds": 5}, trigger=TriggerKind.MANUAL).run_id
    if action == "retry":
        _post(client, f"/runs/{run_id}/cancel")
    before = TaskHistory.objects.get(id=run_id).state
    runs = TaskHistory.objects.count()

    refused = _post(client, f"/runs/{run_id}/{action}", body)

    assert refused.status_code == 422
    assert [e["loc"][-1] for e in refused.json()["errors"]] == [field]
    assert _state(run_id) == before and TaskHistory.objects.count() == runs
