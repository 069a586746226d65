# Runs by tag (`runs.search`): a GIN index on the tags, built concurrently (see 0034).

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0034_run_input_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskhistory",
            index=django.contrib.postgres.indexes.GinIndex(fields=["tags"], name="task_history_tags"),
        ),
    ]
