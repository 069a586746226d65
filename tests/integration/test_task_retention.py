"""Retention per task (issue 42): a task's `Retention` deletes its completed and its failed or
cancelled runs each past its own age, keeps its newest runs whatever their age, falls back to the
global retention for what it leaves unset, and leaves every other task to the global one; in
batches that skip what another transaction holds."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import count

import psycopg2.extensions
import pytest
from django.conf import LazySettings
from django.db import connection
from django.utils import timezone

from orchestrator.models import TaskHistory, TaskHistoryAudit
from orchestrator.runs.context import RunContext
from orchestrator.states import RunState
from orchestrator.stores.retention import (
    FIRST_MOMENT,
    PRUNE_RUNS,
    prune_history,
    prune_in_batches,
    runs_params,
    seconds_ago,
)
from tasks import NoInput, Retention, registry
from tasks.definitions.maintenance import history_retention
from tasks.registry import Registry
from tests.integration.test_history_retention import other_transaction  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

DAY_S = 86400
GLOBAL_DAYS = 30
_made = count()


@pytest.fixture(autouse=True)
def global_retention(settings: LazySettings) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, history_retention_s=GLOBAL_DAYS * DAY_S)


def _ago(days: float) -> datetime:
    return timezone.now() - timedelta(days=days)


def _run(task: str, state: RunState, ended_days_ago: float | None, *, name: str = "") -> str:
    """A run of `task`, created a moment after the previous one made here (newest last)."""
    run_id = f"run_{next(_made):06d}{name or task}"[:40]
    TaskHistory.objects.create(
        id=run_id, task_id=task, priority=5, identity=run_id, state=state,
        finished_at=None if ended_days_ago is None else _ago(ended_days_ago),
    )  # fmt: skip
    return run_id


def _left() -> set[str]:
    return set(TaskHistory.objects.values_list("id", flat=True))


def test_completed_and_failed_runs_each_go_past_their_own_age() -> None:
    own = {"brief": Retention(completed_s=DAY_S, failed_s=10 * DAY_S)}
    gone = [
        _run("brief", RunState.COMPLETED, 2),
        _run("brief", RunState.FAILED, 11),
        _run("brief", RunState.CANCELLED, 11),  # cancelled counts with failed
    ]
    kept = [
        _run("brief", RunState.COMPLETED, 0.5),
        _run("brief", RunState.FAILED, 2),
        _run("brief", RunState.CANCELLED, 2),
        _run("brief", RunState.ACTIVE, None),
    ]

    pruned = prune_history(retention=own)

    assert pruned.runs == len(gone)
    assert _left() == set(kept)


def test_keep_last_keeps_the_newest_ended_runs_however_old() -> None:
    own = {"rare": Retention(completed_s=0, failed_s=0, keep_last=2)}
    older = [_run("rare", RunState.COMPLETED, 100), _run("rare", RunState.FAILED, 90)]
    newest = [_run("rare", RunState.COMPLETED, 80), _run("rare", RunState.CANCELLED, 70)]
    live = _run("rare", RunState.PENDING, None)  # not ended: not one of the kept two

    pruned = prune_history(retention=own)

    assert pruned.runs == len(older)
    assert _left() == {*newest, live}


def test_keep_last_beyond_the_runs_there_are_keeps_them_all() -> None:
    runs = {_run("rare", RunState.COMPLETED, 100), _run("rare", RunState.FAILED, 100)}

    pruned = prune_history(retention={"rare": Retention(completed_s=0, keep_last=5)})

    assert (pruned.runs, _left()) == (0, runs)


def test_a_field_left_none_is_the_global_retention() -> None:
    own = {"half": Retention(completed_s=DAY_S)}  # failed_s: the global 30 days
    gone = {_run("half", RunState.COMPLETED, 2), _run("half", RunState.FAILED, GLOBAL_DAYS + 1)}
    kept = {_run("half", RunState.FAILED, GLOBAL_DAYS - 1), _run("half", RunState.COMPLETED, 0.5)}

    pruned = prune_history(retention=own)

    assert pruned.runs == len(gone)
    assert _left() == kept


def test_a_task_without_retention_keeps_the_global_one_and_its_audit_follows_its_runs() -> None:
    own = {
        "brief": Retention(completed_s=0, failed_s=0),
        "long": Retention(completed_s=90 * DAY_S, keep_last=1),
    }
    plain_gone = _run("plain", RunState.COMPLETED, GLOBAL_DAYS + 1)
    plain_kept = {_run("plain", RunState.COMPLETED, 2), _run("plain", RunState.FAILED, 2)}
    long_gone = _run("long", RunState.FAILED, GLOBAL_DAYS + 2)  # failed_s: the global
    long_kept = {_run("long", RunState.COMPLETED, 60), _run("long", RunState.COMPLETED, 45)}
    brief_gone = _run("brief", RunState.COMPLETED, 0.01)
    TaskHistoryAudit.objects.update(at=_ago(GLOBAL_DAYS + 5))

    pruned = prune_history(retention=own)

    assert pruned.runs == 3
    assert _left() == {*plain_kept, *long_kept}
    # A deleted run's state changes went with it; a kept run keeps its own, however old.
    audited = set(TaskHistoryAudit.objects.values_list("run_id", flat=True))
    assert audited == {*plain_kept, *long_kept}
    assert not {plain_gone, long_gone, brief_gone} & audited


def test_small_batches_still_delete_everything(settings: LazySettings) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, retention_batch=2)
    own = {"brief": Retention(completed_s=DAY_S), "rare": Retention(failed_s=0, keep_last=1)}
    for days in (3, 4, 5):
        _run("brief", RunState.COMPLETED, days)
        _run("plain", RunState.COMPLETED, GLOBAL_DAYS + days)
    _run("rare", RunState.FAILED, 2)
    kept = _run("rare", RunState.FAILED, 1)

    pruned = prune_in_batches(
        PRUNE_RUNS, runs_params(seconds_ago(GLOBAL_DAYS * DAY_S), own), start=FIRST_MOMENT
    )

    assert (pruned.deleted, pruned.batches) == (7, 4)  # 2 + 2 + 2 + 1
    assert _left() == {kept}


def test_a_run_another_transaction_holds_is_skipped_not_waited_for(
    other_transaction: psycopg2.extensions.cursor,  # noqa: F811 (the fixture imported above)
) -> None:
    own = {"brief": Retention(completed_s=DAY_S, keep_last=1)}
    runs = [_run("brief", RunState.COMPLETED, 5 - index) for index in range(5)]
    held = runs[1]
    other_transaction.execute("SELECT 1 FROM task_history WHERE id = %s FOR UPDATE", [held])
    # Waiting on the held row would fail the test here instead of hanging it.
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")
    try:
        pruned = prune_history(batch=2, retention=own)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    assert pruned.runs == 3
    assert _left() == {held, runs[-1]}  # the held one, and the newest (keep_last=1)


@pytest.fixture
def declared() -> Iterator[None]:
    """The registry with a task that declares its own retention (`short-lived`)."""
    original = registry.get()
    base = next(iter(original.values()))
    short = dataclasses.replace(base, id="short-lived", retention=Retention(completed_s=DAY_S))
    registry.install(
        Registry([*original.values(), short], original.triggers.values(), original.limits.values())
    )
    try:
        yield
    finally:
        registry.install(original)


@pytest.mark.usefixtures("declared")
def test_the_history_retention_task_reads_each_task_s_retention_from_the_registry() -> None:
    _run("short-lived", RunState.COMPLETED, 2)
    kept = _run("plain", RunState.COMPLETED, 2)

    result = history_retention(RunContext("run_01RETENTION000000000000000", NoInput()), NoInput())

    assert result["deleted"] == 1
    assert _left() == {kept}
