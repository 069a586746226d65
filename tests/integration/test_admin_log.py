"""Every operator action in the admin lands in the admin log under the operator's name."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tests.support.users import PASSWORD, operator

pytestmark = pytest.mark.django_db(transaction=True)


def _operator() -> tuple[Client, int]:
    user = operator("actor")
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client, user.pk


def _logged(user_id: int) -> list[str]:
    return list(
        LogEntry.objects.filter(user_id=user_id)
        .order_by("id")
        .values_list("change_message", flat=True)
    )


def test_start_cancel_retry_and_force_enable_are_logged_with_who_did_them() -> None:
    client, user_id = _operator()

    client.post(
        "/admin/orchestrator/taskhistory/start/",
        {"task": "test-record-order", "input": '{"label": "logged"}', "priority": ""},
    )
    started = TaskHistory.objects.get(task_id="test-record-order")
    client.post(
        "/admin/orchestrator/taskhistory/",
        {"action": "cancel_runs", "_selected_action": [started.id]},
    )
    assert TaskHistory.objects.get(id=started.id).state == RunState.CANCELLED
    client.post(
        "/admin/orchestrator/taskhistory/",
        {"action": "retry_runs", "_selected_action": [started.id]},
    )
    retried = TaskHistory.objects.exclude(id=started.id).get(task_id="test-record-order")
    client.post("/admin/orchestrator/taskhistory/tasks/test-noop/force-enable/")

    assert _logged(user_id) == [
        f"started test-record-order as {started.id}",
        f"cancelled run {started.id} (now cancelled)",
        f"retried run {started.id} as {retried.id}",
        "force-enabled the circuit of test-noop",
    ]


def test_a_refused_action_logs_nothing() -> None:
    client, user_id = _operator()
    handle = start_run("test-record-order", {"label": "x"}, trigger=TriggerKind.API)
    TaskHistory.objects.filter(id=handle.run_id).update(state=RunState.COMPLETED)

    client.post(
        "/admin/orchestrator/taskhistory/",
        {"action": "cancel_runs", "_selected_action": [handle.run_id]},
    )

    assert _logged(user_id) == []
