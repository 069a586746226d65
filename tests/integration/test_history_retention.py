"""history-retention: old terminal runs and old state changes go; live runs and recent ones stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from orchestrator.models import TaskHistory, TaskHistoryAudit
from orchestrator.runs.context import RunContext
from orchestrator.states import RunState
from tasks.definition import NoInput
from tasks.definitions.demo import history_retention

pytestmark = pytest.mark.django_db(transaction=True)


def _run(run_id: str, state: RunState, finished_days_ago: int | None) -> None:
    finished = (
        None if finished_days_ago is None else timezone.now() - timedelta(days=finished_days_ago)
    )
    TaskHistory.objects.create(
        id=run_id, task_id="test-noop", priority=5, identity=run_id, state=state,
        finished_at=finished,
    )  # fmt: skip


def test_old_runs_and_old_state_changes_go() -> None:
    keep_days = settings.CONFIG.history_retention_days
    _run("run_01OLD000000000000000000000", RunState.COMPLETED, keep_days + 1)
    _run("run_01NEW000000000000000000000", RunState.COMPLETED, 1)
    _run("run_01LIVE00000000000000000000", RunState.ACTIVE, None)
    TaskHistoryAudit.objects.filter(run_id="run_01OLD000000000000000000000").update(
        at=timezone.now() - timedelta(days=keep_days + 1)
    )

    result = history_retention(RunContext("run_01RETENTION000000000000000", NoInput()), NoInput())

    assert result == {"deleted": 1, "audit_deleted": 1}
    assert set(TaskHistory.objects.values_list("id", flat=True)) == {
        "run_01NEW000000000000000000000",
        "run_01LIVE00000000000000000000",
    }
    assert not TaskHistoryAudit.objects.filter(run_id="run_01OLD000000000000000000000").exists()
    assert TaskHistoryAudit.objects.filter(run_id="run_01NEW000000000000000000000").exists()
