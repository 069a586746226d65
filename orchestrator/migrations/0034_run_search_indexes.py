# Runs by what they were about (`runs.search`): GIN indexes on the input (jsonb_path_ops, for
# `@>`) and the tags, built without holding writes off a long history: concurrently, so
# outside a transaction.

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0033_run_tags"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskhistory",
            index=django.contrib.postgres.indexes.GinIndex(
                fields=["input"], opclasses=["jsonb_path_ops"], name="task_history_input"
            ),
        ),
        AddIndexConcurrently(
            model_name="taskhistory",
            index=django.contrib.postgres.indexes.GinIndex(fields=["tags"], name="task_history_tags"),
        ),
    ]
