# A run's tags (`runs.search`): a column with a default in the database too, so the raw SQL
# inserts that do not name it (insert_run.sql's siblings) keep working. Adding it with a
# constant default rewrites nothing (Postgres 11+).

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0032_notifications"),
    ]

    operations = [
        migrations.AddField(
            model_name="taskhistory",
            name="tags",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=64),
                blank=True,
                db_default=[],
                default=list,
                size=None,
            ),
        ),
    ]
