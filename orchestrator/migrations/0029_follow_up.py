"""One follow-up after a followed run (issue 39, `runs.coalesce`): the trigger that makes it due
with the end of the run it waits for, and a partial unique index, one waiting follow-up per
identity, built concurrently (a plain CREATE INDEX would hold off every run's writes for the
whole build)."""

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models

INDEX = """
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS task_history_follow_up_one
    ON task_history (task_id, identity)
 WHERE state = 'pending' AND trigger ? 'waitsFor'
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0028_debounce_one"),
    ]

    operations = [
        pgtrigger.migrations.AddTrigger(
            model_name="taskhistory",
            trigger=pgtrigger.compiler.Trigger(
                name="run_follow_up",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NEW.trigger ? 'followed' AND OLD.state IS DISTINCT FROM NEW.state AND NEW.state IN ('completed', 'failed', 'cancelled'))",
                    func="-- The body of the trigger run_follow_up on task_history (`models.runs`), fired by the end of a\n-- followed run (NEW), whichever path writes it: the follow-up waiting for that run becomes due now\n-- and follows it (`trigger.follows`) instead of waiting for it (`runs.coalesce`); the due loop\n-- publishes it. The lookup is the partial unique index task_history_follow_up_one's own.\n-- Parameters: none.\nUPDATE task_history\n   SET not_before = now(), updated_at = now(),\n       trigger = (trigger - 'waitsFor') || jsonb_build_object('follows', NEW.id)\n WHERE task_id = NEW.task_id AND identity = NEW.identity\n   AND state = 'pending' AND trigger ->> 'waitsFor' = NEW.id\n;\nRETURN NULL;",
                    hash="b7ea6a65ac69979f61629200d9e76b679e420ffa",
                    operation='UPDATE OF "state"',
                    pgid="pgtrigger_run_follow_up_c0567",
                    table="task_history",
                    when="AFTER",
                ),
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    INDEX,
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS task_history_follow_up_one",
                )
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="taskhistory",
                    constraint=models.UniqueConstraint(
                        models.F("task_id"),
                        models.F("identity"),
                        condition=models.Q(("state", "pending"), ("trigger__has_key", "waitsFor")),
                        name="task_history_follow_up_one",
                    ),
                )
            ],
        ),
    ]
