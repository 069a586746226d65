"""The release loop's index: delayed starts (`start_run(..., not_before=...)`) not yet released.

Partial, so it holds only the runs waiting for their start time (pending, never attempted, with
a `not_before`), and the loop's query every LUMASTRA_DUE_POLL_S reads a few index entries, not
the pending backlog. Built concurrently: a plain CREATE INDEX would hold off every run's writes."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0021_task_pause"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskhistory",
            index=models.Index(
                condition=models.Q(("attempts", 0), ("not_before__isnull", False), ("state", "pending")),
                fields=["not_before"],
                name="task_history_due",
            ),
        ),
    ]
