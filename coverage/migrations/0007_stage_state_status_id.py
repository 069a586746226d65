"""The coverage rows' `(stage, status)` index gets the row id as a third column (issue 13,
console speed): the admin's rows of one stage and status, newest first (the backlog's
drill-down), are read from it directly instead of a backward walk of every row (210 ms at
1.66 M rows for a rare status; `bench/console.py`). The backlog's counts per stage and status
stay an index-only scan of it (as fast as of the old index: the scan's cost is the counting).

The new index is built, concurrently, before the old one goes, so the backlog never loses its
index; both concurrently: the table takes a write per run of a covered stage."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("coverage", "0006_run_triggers_v2"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="mediaitemstagestate",
            index=models.Index(
                models.F("stage"), models.F("status"), models.F("id"), name="stage_state_status_id"
            ),
        ),
        RemoveIndexConcurrently(
            model_name="mediaitemstagestate",
            name="stage_state_backlog",
        ),
    ]
