"""The runs list's priority filter (issue 13, console speed): its newest runs and its count come
from `(priority, created_at DESC)` instead of a read of the whole table (150 ms at 1,000,000
runs for the count of a rare priority; `bench/console.py`).

Built concurrently: task_history may hold millions of rows, and a plain CREATE INDEX would
hold off every run's writes while it scans them."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0015_dead_letters_and_schedule_switch"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskhistory",
            index=models.Index(
                fields=["priority", "-created_at"], name="task_history_priority_created"
            ),
        ),
    ]
