"""Daily quotas: counted per task and UTC day; starts past max_runs_per_day are refused."""

from __future__ import annotations

import pytest
from django.db import transaction

from orchestrator.hooks.quotas import QuotaExceeded
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


def _usage() -> TaskQuotaUsage:
    return TaskQuotaUsage.objects.get(task_id="test-quota")


@pytest.mark.worker
def test_quota_counts_runs_and_refuses_past_the_cap(celery_worker: object) -> None:
    outcomes = ["crash", "permanent", "permanent"]
    started = [
        start_run("test-quota", {"how": how}, trigger=TriggerKind.MANUAL) for how in outcomes
    ]

    with pytest.raises(QuotaExceeded, match=r"'test-quota' reached its quota of 3 runs") as exc:
        start_run("test-quota", {"how": "crash"}, trigger=TriggerKind.MANUAL)

    assert exc.value.retry_after is not None and exc.value.retry_after.total_seconds() > 0
    assert TaskHistory.objects.filter(task_id="test-quota").count() == 3
    wait_for(lambda: _usage().failed == 3)
    usage = _usage()
    assert (usage.started, usage.completed, usage.failed) == (3, 0, 3)
    assert {r.run_id for r in started} == set(
        TaskHistory.objects.filter(task_id="test-quota").values_list("id", flat=True)
    )
    refusals = valkey.client().hgetall(keys.refusals("test-quota", str(usage.day)))
    assert refusals == {"quota_exceeded": "1"}


def test_a_rolled_back_start_gives_its_unit_back() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        start_run("test-quota", {"how": "crash"}, trigger=TriggerKind.MANUAL)
        raise RuntimeError("caller aborts")

    assert not TaskQuotaUsage.objects.exists()
    for _ in range(3):
        start_run("test-quota", {"how": "crash"}, trigger=TriggerKind.MANUAL)
    assert _usage().started == 3
