"""Daily quotas: counted per task and UTC day; starts past max_runs_per_day are refused."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import pytest
from django.db import connection, transaction

from orchestrator.clock import SYSTEM
from orchestrator.hooks import dispatch, quotas
from orchestrator.hooks.base import Admission, Part, Refused, RunHook
from orchestrator.hooks.pause import Paused
from orchestrator.hooks.quotas import QuotaExceeded
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.runs.handle import RunHandle
from orchestrator.runs.start import start_run
from orchestrator.runs.terminal import settle
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.errors import ErrorKind
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


# --- tasks without a daily cap: counted in Valkey, rolled up -------------------------------

# No cap, and no shared worker takes its queue: its runs wait, so the test ends them.
UNCAPPED = "test-record-order"


def _today() -> date:
    return SYSTEM.now().date()


def _start() -> RunHandle:
    return start_run(UNCAPPED, {"label": "quota"}, trigger=TriggerKind.MANUAL)


def _counts() -> quotas.Counts:
    return quotas.usage([registry.get()[UNCAPPED]], _today())[UNCAPPED]


def _row_version() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM task_quota_usage WHERE task_id = %s", [UNCAPPED])
        return str(cursor.fetchone()[0])


def _end(run_id: str, state: RunState) -> None:
    """The end of a run as the runner settles it: its end script and every installed hook."""
    kind = ErrorKind.FATAL if state == RunState.FAILED else None
    settle(run_id, UNCAPPED, state, fenced=False, error_kind=kind)


def test_an_uncapped_task_writes_no_quota_row_per_start_or_end() -> None:
    started = [_start() for _ in range(3)]
    _end(started[0].run_id, RunState.COMPLETED)
    _end(started[1].run_id, RunState.FAILED)

    assert not TaskQuotaUsage.objects.filter(task_id=UNCAPPED).exists()
    # Read back with the counts not yet rolled up: no lag for the API and the admin.
    assert _counts() == quotas.Counts(started=3, completed=1, failed=1)


def test_the_rollup_copies_the_counts_and_twice_counts_once() -> None:
    for _ in range(2):
        handle = _start()
        _end(handle.run_id, RunState.COMPLETED)

    quotas.rollup()
    written = _row_version()
    quotas.rollup()

    assert _row_version() == written  # nothing changed: the row is not rewritten

    row = TaskQuotaUsage.objects.get(task_id=UNCAPPED)
    assert (row.day, row.started, row.completed, row.failed) == (_today(), 2, 2, 0)
    assert _counts() == quotas.Counts(started=2, completed=2, failed=0)


def test_the_rollup_never_lowers_a_count() -> None:
    """A Valkey that lost its counts (or a stale snapshot) cannot undo what was rolled up."""
    for _ in range(3):
        _start()
    quotas.rollup()
    valkey.client().delete(keys.quota_counts(UNCAPPED, _today().isoformat()))

    _start()
    quotas.rollup()

    assert TaskQuotaUsage.objects.get(task_id=UNCAPPED).started == 3
    assert _counts().started == 3


def test_a_rollup_that_lost_its_seat_writes_nothing() -> None:
    class Lost:
        def check(self) -> None:
            raise RuntimeError("seat lost")

    _start()

    with pytest.raises(RuntimeError, match="seat lost"):
        quotas.rollup(fence=Lost())
    assert not TaskQuotaUsage.objects.filter(task_id=UNCAPPED).exists()


@dataclass
class _RefusesInItsReply(RunHook):
    """Refuses a start from the reply of a command sent in the same pipeline as the quota's
    count, after it in the chain or before it."""

    name: str = "refuser"

    def plan_admit(self, admission: Admission) -> Part:
        def receive(replies: list[Any]) -> None:
            raise Refused("no")

        return Part(receive, lambda pipe: pipe.ping())


@pytest.mark.parametrize("refuser_first", [True, False])
def test_a_refused_start_gives_its_uncapped_count_back(refuser_first: bool) -> None:
    chain = dispatch.installed()
    quota = next(hook for hook in chain if isinstance(hook, quotas.DailyQuota))
    hooks = [_RefusesInItsReply(), quota]
    dispatch.install(hooks if refuser_first else hooks[::-1])
    try:
        with pytest.raises(Refused):
            _start()
    finally:
        dispatch.install(chain)

    assert _counts().started == 0


@pytest.mark.parametrize("scope", ["task", "class"])
def test_a_start_a_pause_refuses_is_judged_by_the_hook_and_not_counted(scope: str) -> None:
    """The admission script, sent alone (the task has no admission hook, and its plan is
    compiled), counts the start and asks the pause hook, which refuses it: the count goes
    back and nothing is written."""
    assert dispatch.plan(registry.get()[UNCAPPED]).admit == ()
    name = UNCAPPED if scope == "task" else registry.get()[UNCAPPED].resource_class
    field = keys.pause_field(scope, name)
    valkey.client().hset(keys.pauses(), field, "refuse")
    try:
        with pytest.raises(Paused):
            _start()
    finally:
        valkey.client().hdel(keys.pauses(), field)

    assert _counts().started == 0
    assert not TaskHistory.objects.filter(task_id=UNCAPPED).exists()
    _start()  # resumed: admitted, and counted once
    assert _counts().started == 1


def test_a_pause_that_holds_starts_takes_them_without_asking_the_hook() -> None:
    field = keys.pause_field("task", UNCAPPED)
    valkey.client().hset(keys.pauses(), field, "hold")
    try:
        handle = _start()
    finally:
        valkey.client().hdel(keys.pauses(), field)

    assert TaskHistory.objects.get(id=handle.run_id).state == "pending"
    assert _counts().started == 1


def test_a_capped_task_keeps_its_exact_count_in_postgres() -> None:
    start_run("test-quota", {"how": "crash"}, trigger=TriggerKind.MANUAL)

    assert _usage().started == 1
    assert not valkey.client().exists(keys.quota_counts("test-quota", _today().isoformat()))
