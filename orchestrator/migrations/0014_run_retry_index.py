"""The index a run's page uses to list the operator retries that name it.

Built concurrently: task_history may hold millions of rows, and a plain CREATE INDEX would
hold off every run's writes while it scans them."""

import django.db.models.fields.json
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0013_webhooks"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskhistory",
            index=models.Index(
                django.db.models.fields.json.KeyTextTransform("retryOf", "trigger"),
                condition=models.Q(("trigger__has_key", "retryOf")),
                name="task_history_retry_of",
            ),
        ),
    ]
