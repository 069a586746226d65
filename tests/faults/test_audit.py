"""The transition audit (task_history_audit, filled by Postgres triggers) and the checker's
judgement of it: every audited (from, to) pair must be legal per RUN_TRANSITIONS."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.utils import timezone

from orchestrator.models import TaskHistory, TaskHistoryAudit
from orchestrator.runs.start import new_run_id, start_run
from orchestrator.states import RUN_TRANSITIONS, IllegalTransition, RunState
from orchestrator.stores import durable
from orchestrator.triggers import TriggerKind
from tests.faults import checker
from tests.faults.checker import illegal_pairs

STATES = [s.value for s in RunState]


def test_every_pair_the_state_table_allows_is_legal_and_no_other() -> None:
    pairs = list(itertools.product(STATES, STATES))
    allowed = {(a.value, b.value) for a, nxt in RUN_TRANSITIONS.items() for b in nxt}

    assert set(illegal_pairs(pairs)) == set(pairs) - allowed
    assert ("completed", "failed") in illegal_pairs(pairs)
    assert ("cancelling", "failed") in illegal_pairs(pairs)


def test_a_row_is_born_pending_or_cancelled_and_nothing_else() -> None:
    born = [(None, state) for state in STATES]

    assert set(illegal_pairs(born)) == {
        (None, s) for s in STATES if s not in ("pending", "cancelled")
    }


def test_unknown_states_are_illegal() -> None:
    assert illegal_pairs([("pending", "started"), ("doing", "failed")]) == [
        ("pending", "started"),
        ("doing", "failed"),
    ]


def _trail(run_id: str) -> list[tuple[str | None, str]]:
    return list(
        TaskHistoryAudit.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("from_state", "to_state")
    )


@pytest.mark.django_db(transaction=True)
def test_the_triggers_record_each_change_of_state_once() -> None:
    run_id = start_run("test-fault-work", {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    durable.claim(run_id, "h:1:x")
    # Writes that leave the state alone record nothing: a heartbeat, a same-state UPDATE.
    durable.heartbeat(run_id, "h:1:x")
    TaskHistory.objects.filter(id=run_id).update(state="active")
    with pytest.raises(IllegalTransition):
        durable.end_cancelled(run_id, finished_at=timezone.now())
    durable.end(run_id, RunState.COMPLETED, finished_at=timezone.now())
    # A guarded write the state table refuses changes nothing, so records nothing.
    with pytest.raises(IllegalTransition):
        durable.end(run_id, RunState.FAILED, finished_at=timezone.now())

    assert _trail(run_id) == [(None, "pending"), ("pending", "active"), ("active", "completed")]
    audit = TaskHistoryAudit.objects.filter(run_id=run_id).order_by("id")
    moments = [row.at for row in audit]
    assert moments == sorted(moments)


@pytest.mark.django_db(transaction=True)
def test_the_checker_finds_an_illegal_move_written_behind_the_guards_back() -> None:
    good = start_run("test-fault-work", {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    durable.request_cancel(good)
    durable.end_cancelled(good, finished_at=timezone.now())
    bad = new_run_id()
    TaskHistory.objects.create(
        id=bad, task_id="test-fault-work", trigger={}, input={}, priority=5, identity=bad
    )
    durable.claim(bad, "h:1:x")
    durable.end(bad, RunState.FAILED, finished_at=timezone.now())
    with connection.cursor() as cursor:  # what no engine path may do: failed → completed
        cursor.execute("UPDATE task_history SET state = 'completed' WHERE id = %s", [bad])
        cursor.execute("SELECT now() - interval '1 minute'")
        since = cursor.fetchone()[0]

    report = checker.check(
        checker.Report("audit"), started=[good, bad], since=since, effects=[], compare_valkey=False
    )

    assert report.illegal == [f"{bad}: failed → completed"]
    assert report.not_once_terminal == [
        f"{bad}: completed, trail "
        "[(None, 'pending'), ('pending', 'active'), ('active', 'failed'), ('failed', 'completed')]"
    ]
    assert not report.lost and not report.stuck
    assert not report.ok
