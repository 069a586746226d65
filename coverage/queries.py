"""Coverage's SQL: named queries, one `.sql` file each under `sql/`.

Queries that judge eligibility hold `${eligible}`, filled with the stage's own condition over
the item row `mi` (`tasks.coverage.CoveredStage.eligible_sql`; `TRUE` when the stage has none
or says it with a Python predicate, asked once when its rows are made). The condition is the
stage author's code, like the task's body, never a user's input. Each query is rendered once
per stage and kept. `${eligible}` is a `string.Template` slot, filled before the query is sent,
not a parameter: a file's `-- Parameters:` line names only its `%(name)s` ones.
"""

from __future__ import annotations

from functools import cache
from string import Template

from orchestrator import sql
from tasks.coverage import CoveredStage


@cache
def _template(name: str) -> Template:
    return Template(sql.load(__file__, name))


def eligibility(stage: CoveredStage) -> str:
    return stage.eligible_sql if stage.eligible_sql is not None else "TRUE"


@cache
def render(name: str, stage: CoveredStage | None = None) -> str:
    """The query `name`, with `stage`'s eligibility where it asks for one."""
    condition = eligibility(stage) if stage is not None else "TRUE"
    return _template(name).substitute(eligible=condition)
