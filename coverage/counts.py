"""The backlog's rows per stage and status, exact, at the cost of the changes, not the rows.

Counting `media_item_stage_state` on each read took 250-460 ms at 1.66 M rows (issue 13). The
counts are kept instead: statement-level triggers on the table (`coverage.models`) append one
row per (stage, status) a statement changed to `coverage_stage_count_delta` — an insert, never
an update of a shared row, so runs ending at once do not queue on a count's lock. A read is
the base (`coverage_stage_count`) plus the deltas since; the stage-sweep's tick folds the
deltas into the base (`fold`), so they stay few. A TRUNCATE of the rows empties both.

`recount` (`manage.py coverage_recount`) counts the rows again and makes that the base: after
a bulk path that writes the rows with their triggers off (`session_replication_role =
replica`, `ALTER TABLE ... DISABLE TRIGGER`), or if the counts are ever found to drift.
"""

from __future__ import annotations

from django.db import connection, transaction

from coverage import queries

# Fold and recount each write the base from what their snapshot saw; one at a time. EXCLUSIVE
# lets reads of the base go on and never meets the writers (they only append deltas).
_LOCK = "LOCK TABLE coverage_stage_count IN EXCLUSIVE MODE"


def read() -> dict[tuple[str, str], int]:
    """The rows per (stage, status), now."""
    with connection.cursor() as cursor:
        cursor.execute(queries.render("backlog_counts"))
        return {(stage, status): count for stage, status, count in cursor.fetchall()}


def fold() -> int:
    """Move the deltas into the base; returns the (stage, status) counts it changed."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_LOCK)
        cursor.execute(queries.render("counts_fold"))
        return int(cursor.rowcount)


def recount() -> int:
    """Count the rows again (one GROUP BY of the table) and make that the base; returns the
    (stage, status) counts it holds."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_LOCK)
        cursor.execute(queries.render("counts_recount"))
        return int(cursor.rowcount)
