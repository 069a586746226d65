"""The admin's paginator for big lists (runs, coverage rows, the catalog): an exact count up to
`exact_up_to` rows, Postgres's estimate past it.

Django's change list counts every row its filters match (`SELECT COUNT(*)`) to number its pages.
Over a million runs or coverage rows that count alone reads the whole table or a whole index:
hundreds of milliseconds on every load, more than the rest of the page. This paginator counts
over a LIMIT subquery, which stops reading at `exact_up_to + 1` rows: a list that short gets its
exact count. A longer one gets the planner's estimate of the filtered query's rows
(`EXPLAIN (FORMAT JSON)`, from the table's statistics: no rows read), never less than the cap,
and `estimated` is True so the page can say "about".

What it does not guarantee: an estimate is only as good as the statistics (ANALYZE); for a
condition they do not describe (a JSON key, say) it can be off by a lot. The last page numbers
shown may then be empty, or pages past the estimate refused as past the end; the first pages,
the ones operators read, are always right.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet

# Counting this many rows (an index's entries, most often) costs a few milliseconds.
EXACT_UP_TO = 10_000


class EstimatedCountPaginator(Paginator[Any]):
    """`ModelAdmin.paginator = EstimatedCountPaginator` for a list that may be large."""

    exact_up_to = EXACT_UP_TO
    estimated = False  # True once `count` gave the planner's estimate

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().count
        # No ORDER BY, no joins for display: the count and the estimate need only the filters.
        bare = rows.order_by().select_related(None)
        exact = bare.values("pk")[: self.exact_up_to + 1].count()
        if exact <= self.exact_up_to:
            return exact
        self.estimated = True
        return max(self.exact_up_to + 1, planner_rows(bare))


def planner_rows(rows: QuerySet[Any]) -> int:
    """Postgres's estimate of how many rows `rows` returns, without running it."""
    sql, params = rows.query.get_compiler(using=rows.db).as_sql()
    with connections[rows.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone() or (None,)
    if isinstance(plan, str):  # the driver left the json column as text
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"]) if plan else 0
