"""Coverage's SQL: named queries, one `.sql` file each under `sql/`.

Queries that judge eligibility hold `${eligible}`, filled with the stage's own condition over
the item row `mi` (`tasks.coverage.CoveredStage.eligible_sql`; `TRUE` when the stage has none
or says it with a Python predicate, asked once when its rows are made). The condition is the
stage author's code, like the task's body, never a user's input. Each query is rendered once
per stage and kept.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from string import Template

from tasks.coverage import CoveredStage

SQL_DIR = Path(__file__).parent / "sql"


@cache
def _template(name: str) -> Template:
    return Template((SQL_DIR / f"{name}.sql").read_text())


def eligibility(stage: CoveredStage) -> str:
    return stage.eligible_sql if stage.eligible_sql is not None else "TRUE"


@cache
def render(name: str, stage: CoveredStage | None = None) -> str:
    """The query `name`, with `stage`'s eligibility where it asks for one."""
    condition = eligibility(stage) if stage is not None else "TRUE"
    return _template(name).substitute(eligible=condition)
