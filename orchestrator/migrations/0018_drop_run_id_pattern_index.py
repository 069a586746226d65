"""Drop the `varchar_pattern_ops` index Django makes beside a CharField primary key (issue 22).

It serves only `id LIKE 'prefix%'`, which nothing asks (the runs list searches task and
identity), yet every state change of a run is a non-HOT update (`state` is indexed) and writes
an entry into it: one index of the eight each end of a run writes.

Dropped concurrently, as 0016 built its index: a plain DROP INDEX would hold off every run's
writes while it waits for its lock."""

from django.db import migrations

INDEX = "task_history_id_db712e1f_like"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("orchestrator", "0017_heartbeat_staleness"),
    ]

    operations = [
        migrations.RunSQL(
            f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}",
            reverse_sql=(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} "
                "ON task_history (id varchar_pattern_ops)"
            ),
        ),
    ]
