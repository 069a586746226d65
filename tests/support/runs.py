"""Rows seeded for recovery tests: runs in states a crash leaves behind."""

from __future__ import annotations

from django.db import connection

from orchestrator.models import TaskHistory
from orchestrator.runs.start import new_run_id


def seed_orphan(heartbeat_age_s: int) -> str:
    """An active run whose worker is gone, last heartbeat `heartbeat_age_s` ago (Postgres clock),
    on its last attempt (test-noop's third), so the reconciler fails it rather than putting it
    back for another attempt (`orchestrator.runs.resume`)."""
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id,
        task_id="test-noop",
        state="active",
        trigger={"kind": "manual"},
        input={},
        priority=5,
        identity=run_id,
        owner_instance_id="gone-host:1:X",
        attempts=3,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE task_history SET heartbeat_at = now() - %s * interval '1 second', "
            "started_at = now() - interval '1 hour' WHERE id = %s",
            [heartbeat_age_s, run_id],
        )
    return run_id
