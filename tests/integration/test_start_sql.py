"""start_run's two statements: the static INSERT writes the row the model describes, and the
idempotency-key lookup is answered from the partial unique index it has."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.states import LIVE_RUN_STATES, RunState
from orchestrator.stores import queries
from orchestrator.triggers import TriggerKind
from tasks import registry

pytestmark = [pytest.mark.django_db(transaction=True)]

# Private: no shared worker takes its messages, so the rows stay as start_run wrote them.
TASK_ID = "test-record-order"


def _columns(run: TaskHistory) -> dict[str, Any]:
    return {f.attname: getattr(run, f.attname) for f in TaskHistory._meta.concrete_fields}


def test_a_started_row_holds_what_the_model_would_have_written() -> None:
    handle = start_run(TASK_ID, {"label": "row"}, trigger=TriggerKind.MANUAL)

    row = _columns(TaskHistory.objects.get(id=handle.run_id))
    definition = registry.get()[TASK_ID]
    # Every default the model declares, for the fields start_run does not set.
    expected = _columns(
        TaskHistory(
            id=handle.run_id,
            task_id=TASK_ID,
            trigger={"kind": "manual"},
            input={"label": "row", "seconds": 0.0},
            priority=handle.priority,
            identity=definition.identity(definition.input_model.model_validate({"label": "row"})),
            processing_version=definition.processing_version,
            stages={},
            created_at=row["created_at"],
            updated_at=row["created_at"],
        )
    )
    assert row == expected
    assert row["state"] == RunState.PENDING


def test_the_common_path_inserts_without_a_savepoint() -> None:
    # Outside a caller's transaction, as the API, the admin and the benchmark call it.
    with CaptureQueriesContext(connection) as captured:
        start_run(TASK_ID, {"label": "one"}, trigger=TriggerKind.MANUAL)

    ours = [q["sql"] for q in captured.captured_queries if "task_history" in q["sql"]]
    assert len(ours) == 1
    assert ours[0].startswith(queries.INSERT_RUN.text.splitlines()[0])
    assert not [q for q in captured.captured_queries if "SAVEPOINT" in q["sql"]]


def _plan(sql: str, params: dict[str, Any]) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        # A handful of rows: a sequential scan would be cheaper, so rule it out to see
        # which index the query can use at all.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(line for (line,) in cursor.fetchall())


def test_the_idempotency_key_lookup_uses_the_live_key_index() -> None:
    for index in range(20):
        start_run(
            TASK_ID,
            {"label": f"k{index}"},
            trigger=TriggerKind.MANUAL,
            idempotency_key=f"key-{index}",
        )
    sql = queries.LIVE_RUN_WITH_KEY
    params = {
        "task_id": TASK_ID,
        "key": "key-7",
        "live_states": sorted(s.value for s in LIVE_RUN_STATES),
    }

    assert "task_history_live_idempotency_key" in _plan(sql, params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        assert len(cursor.fetchall()) == 1
