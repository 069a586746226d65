"""Run ↔ row triggers, version 2 (sql/0006_run_triggers.sql says what changed), and
`rerun_requested`: an item that changed while its run was going is done again."""

from pathlib import Path

from django.db import migrations, models

SQL = (Path(__file__).parent / "sql" / "0006_run_triggers.sql").read_text()
# Back to version 1: the functions of migration 0004.
REVERSE = (Path(__file__).parent / "sql" / "0004_run_triggers.sql").read_text()


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
