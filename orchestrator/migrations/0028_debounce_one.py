"""One waiting run per identity of a debounced task (issue 39, `runs.coalesce`): a partial unique
index over the few runs that wait for their debounce (pending, never attempted, not released,
`trigger ? 'debounce'`). Built concurrently: a plain CREATE INDEX would hold off every run's
writes for the whole build."""

from django.db import migrations, models

INDEX = """
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS task_history_debounce_one
    ON task_history (task_id, identity)
 WHERE state = 'pending' AND attempts = 0 AND not_before IS NOT NULL AND trigger ? 'debounce'
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0027_scheduler_failures_since"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    INDEX,
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS task_history_debounce_one",
                )
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="taskhistory",
                    constraint=models.UniqueConstraint(
                        models.F("task_id"),
                        models.F("identity"),
                        condition=models.Q(
                            ("attempts", 0),
                            ("not_before__isnull", False),
                            ("state", "pending"),
                            ("trigger__has_key", "debounce"),
                        ),
                        name="task_history_debounce_one",
                    ),
                )
            ],
        ),
    ]
