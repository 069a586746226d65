"""Drop the `varchar_pattern_ops` index Django makes beside the audit trail's indexed `run_id`.

As 0018 did for `task_history.id`: it serves only `run_id LIKE 'prefix%'`, which nothing asks
(the run page and the fault battery look a run's changes up by equality), yet every state
change of a run writes its audit row into it, and a short run's end writes two (the folded
claim's two moves, 0019): two index entries of every no-op run's one waited commit (issue 22).

Dropped concurrently: a plain DROP INDEX would hold off every run's writes while it waits for
its lock."""

from django.db import migrations

INDEX = "task_history_audit_run_id_c2f03541_like"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0019_record_folded_claims"),
    ]

    operations = [
        migrations.RunSQL(
            f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}",
            reverse_sql=(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} "
                "ON task_history_audit (run_id varchar_pattern_ops)"
            ),
        ),
    ]
