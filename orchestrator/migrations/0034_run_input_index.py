# Runs by an input field (`runs.search`): a GIN index on the input (jsonb_path_ops, for `@>`),
# built without holding writes off a long history: concurrently, so outside a transaction. One
# index a migration: a build that fails leaves the migrations before it done, and this one to
# run again (after `DROP INDEX CONCURRENTLY task_history_input` if the failed build left it
# INVALID).

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
    ]
