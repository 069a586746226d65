"""Runs the browser tests start behind the pages' backs (as a schedule or the API would), and
waits on their state in Postgres."""

from __future__ import annotations

import uuid
from typing import Any

from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for


def start(task: str, data: dict[str, Any] | None = None) -> str:
    return start_run(task, data or {}, trigger=TriggerKind.MANUAL).run_id


def state_of(run_id: str) -> str:
    return TaskHistory.objects.values_list("state", flat=True).get(id=run_id)


def until(run_id: str, state: RunState) -> None:
    wait_for(lambda: state_of(run_id) == state.value)


def retry_of(run_id: str) -> str:
    """The run started to retry (or resume, or requeue) `run_id`."""
    return TaskHistory.objects.get(trigger__retryOf=run_id).id


def exhausted_run() -> str:
    """A dead letter as it happens: test-flaky failing more often than its three attempts
    allow, on the private worker (`private_worker`)."""
    run_id = start("test-flaky", {"label": f"browser-{uuid.uuid4().hex}", "fail_times": 9})
    until(run_id, RunState.FAILED)
    assert TaskHistory.objects.get(id=run_id).error["exhausted"] is True
    return run_id
