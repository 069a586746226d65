"""The dead-letters page's indexes and the switch of a dynamic schedule's row.

- `task_history_dead_letters`: the runs that exhausted their retries, newest first (partial:
  failed with `error.exhausted`), so the page's count and list read those rows only.
- `webhook_delivery_dead`: the dead deliveries, newest first (partial), for the same reason.
- `scheduler_state.disabled`: an operator switched a dynamic schedule's row off (a database
  default, so the fire path's raw upsert, which does not name it, and a replica still on the
  previous release keep working).

The indexes are built concurrently: task_history may hold millions of rows, and a plain
CREATE INDEX would hold off every run's writes while it scans them."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0014_run_retry_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedulerstate",
            name="disabled",
            field=models.BooleanField(db_default=False, default=False),
        ),
        AddIndexConcurrently(
            model_name="taskhistory",
            index=models.Index(
                condition=models.Q(("error__exhausted", True), ("state", "failed")),
                fields=["-created_at"],
                name="task_history_dead_letters",
            ),
        ),
        AddIndexConcurrently(
            model_name="webhookdelivery",
            index=models.Index(
                condition=models.Q(("status", "dead")),
                fields=["-created_at"],
                name="webhook_delivery_dead",
            ),
        ),
    ]
