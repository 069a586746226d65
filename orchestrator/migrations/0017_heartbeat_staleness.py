"""One definition of "this live run's heartbeat is stale" (issue 22), for every query that judges
it: the orphan candidates and their end, the pipeline recovery, a stage retried by the
reconciler, a lost claim put back, a redelivered message's owner.

A live run's last sign of life, by the Postgres clock, is its heartbeat; until the first one
lands, its start (the claim stamps both, so an active run has a heartbeat); for a run cancelled
before it ever started, the cancel request (`updated_at`). Both functions are plain SQL
expressions, so the planner inlines them into the query that calls them."""

from django.db import migrations

from orchestrator import sql

LAST_BEAT = sql.load(__file__, "0017_last_beat")
HEARTBEAT_STALE = sql.load(__file__, "0017_heartbeat_stale")


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0016_run_priority_index"),
    ]

    operations = [
        migrations.RunSQL(LAST_BEAT, "DROP FUNCTION lumastra_last_beat(task_history);"),
        migrations.RunSQL(
            HEARTBEAT_STALE, "DROP FUNCTION lumastra_heartbeat_stale(task_history, float8);"
        ),
    ]
