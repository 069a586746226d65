"""Run ↔ row triggers on task_history (sql/0004_run_triggers.sql says what they do)."""

from django.db import migrations

from orchestrator import sql

# The SQL of a migration is never edited once released: a change is a new file and migration.
SQL = sql.load(__file__, "0004_run_triggers")

REVERSE = """
DROP TRIGGER IF EXISTS coverage_run_ended ON task_history;
DROP TRIGGER IF EXISTS coverage_run_started ON task_history;
DROP FUNCTION IF EXISTS coverage_run_ended();
DROP FUNCTION IF EXISTS coverage_run_started();
DROP FUNCTION IF EXISTS coverage_backoff(integer);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("coverage", "0003_coverage_state"),
        ("orchestrator", "0011_quota_cost"),
    ]

    operations = [migrations.RunSQL(SQL, REVERSE)]
