"""A run's three statements as server-side prepared statements (issue 9): text for the first
uses on a connection, then PREPARE with the first EXECUTE in one round trip, then EXECUTE
alone; a statement the server forgot is sent again as text; threshold 0 never prepares."""

from __future__ import annotations

import dataclasses

import pytest
from django.conf import LazySettings
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext

from orchestrator.models import TaskHistory
from orchestrator.runs.runner import run_message
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind

pytestmark = [pytest.mark.django_db(transaction=True)]

# test-noop without a worker on its queue: the shared worker would take the message first.
TASK = "test-rt-plain"
# A first delivery's read of what its claim needs (read_claimable.sql), sent as text.
READ = "SELECT input, identity, priority, attempts + 1"


def _runs(count: int) -> list[str]:
    """`count` runs started and run in this process; the statements they sent, in order."""
    with CaptureQueriesContext(connection) as captured:
        for _ in range(count):
            run_message(TASK, start_run(TASK, {}, trigger=TriggerKind.MANUAL).run_id, 1)
    return [q["sql"] for q in captured.captured_queries]


def _forms(sent: list[str], name: str, table_verb: str) -> list[str]:
    """How each use of one query went: 'text', 'prepare' (PREPARE and EXECUTE) or 'execute'."""
    forms = []
    for sql in sent:
        if f"PREPARE lumastra_{name} AS" in sql:
            assert f"EXECUTE lumastra_{name}(" in sql  # in the same round trip
            forms.append("prepare")
        elif f"EXECUTE lumastra_{name}(" in sql:
            forms.append("execute")
        elif table_verb in sql:
            forms.append("text")
    return forms


def _threshold(settings: LazySettings, uses: int) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, db_prepare_threshold=uses)


def test_a_connection_prepares_a_runs_statements_once_they_are_used_often(
    settings: LazySettings,
) -> None:
    _threshold(settings, 3)
    connection.close()  # a new connection: nothing prepared on it yet

    sent = _runs(5)

    expected = ["text", "text", "prepare", "execute", "execute"]
    assert _forms(sent, "insert_run", "INSERT INTO task_history") == expected
    assert _forms(sent, "read_claimable", READ) == expected
    assert _forms(sent, "end_run", "UPDATE task_history\n   SET state = 'completed'") == expected
    assert set(TaskHistory.objects.values_list("state", flat=True)) == {"completed"}


def test_a_statement_the_server_forgot_is_sent_again_as_text(settings: LazySettings) -> None:
    _threshold(settings, 1)
    connection.close()
    _runs(1)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does

    # Inside a caller's transaction the failed EXECUTE spoils it: that start fails, once.
    with pytest.raises(OperationalError, match="does not exist"), transaction.atomic():
        start_run(TASK, {}, trigger=TriggerKind.MANUAL)
    sent = _runs(2)

    # Outside one (a start with nothing to roll back, the claim's read, the end) it is sent
    # again as text at once.
    assert _forms(sent, "read_claimable", READ) == ["execute", "text", "text"]
    assert _forms(sent, "insert_run", "INSERT INTO task_history") == ["text", "text"]
    assert TaskHistory.objects.filter(state="completed").count() == 3


def test_a_start_outside_a_transaction_resends_a_forgotten_statement_at_once(
    settings: LazySettings,
) -> None:
    _threshold(settings, 1)
    connection.close()
    _runs(1)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")

    sent = _runs(1)

    assert _forms(sent, "insert_run", "INSERT INTO task_history") == ["execute", "text"]
    assert TaskHistory.objects.filter(state="completed").count() == 2


def test_threshold_zero_never_prepares(settings: LazySettings) -> None:
    _threshold(settings, 0)
    connection.close()

    sent = _runs(3)

    assert not any("PREPARE lumastra_" in sql or "EXECUTE lumastra_" in sql for sql in sent)
    assert TaskHistory.objects.filter(state="completed").count() == 3
