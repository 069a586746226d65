"""Run ↔ row triggers, version 2 (sql/0006_run_triggers.sql says what changed), and
`rerun_requested`: an item that changed while its run was going is done again."""

from django.db import migrations, models

from orchestrator import sql

SQL = sql.load(__file__, "0006_run_triggers")
# Back to version 1: the functions of migration 0004.
REVERSE = sql.load(__file__, "0004_run_triggers")


class Migration(migrations.Migration):
    dependencies = [("coverage", "0005_items_by_kind_and_id")]

    operations = [
        migrations.AddField(
            model_name="mediaitemstagestate",
            name="rerun_requested",
            field=models.BooleanField(db_default=False),
        ),
        migrations.RunSQL(SQL, REVERSE),
    ]
