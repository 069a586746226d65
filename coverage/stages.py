"""The covered stages the registry declares, as the sweep and the dispatcher see them.

`covered()` lists each stage with the task that covers it. `sync()` keeps one
`coverage_stage` row per stage (a stage's run binds to its rows only through that row, see
migration 0004). `check_eligibility()` asks Postgres to plan each stage's condition, so a
fragment that does not parse (or names a column that does not exist) stops the worker's
loops at start, naming the stage, instead of failing every sweep tick.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from coverage.models import CoverageStage
from coverage.queries import render
from tasks import registry
from tasks.coverage import CoveredStage
from tasks.definition import TaskDefinition


class EligibilityError(ValueError):
    """A stage's eligibility condition is not valid SQL over `mi`."""


@dataclass(frozen=True)
class Covered:
    stage: CoveredStage
    task: TaskDefinition

    @property
    def id(self) -> str:
        return self.stage.id

    @property
    def driven(self) -> bool:
        """Whether the sweep starts this stage's runs."""
        return self.stage.enqueueable and authoritative(self.stage.id)


def authoritative(stage_id: str) -> bool:
    listed = settings.COVERAGE.authoritative_stages
    return "*" in listed or stage_id in listed


def covered() -> list[Covered]:
    return [
        Covered(stage, definition)
        for definition in registry.get().values()
        for stage in definition.covers_stages
    ]


def find(stage_id: str) -> Covered | None:
    return next((c for c in covered() if c.id == stage_id), None)


def sync(stages: list[Covered]) -> dict[str, CoverageStage]:
    """One `coverage_stage` row per stage, bound to its covering task; returns them by id."""
    rows = {row.id: row for row in CoverageStage.objects.filter(id__in=[c.id for c in stages])}
    for c in stages:
        row = rows.get(c.id)
        if row is None:
            row, _ = CoverageStage.objects.get_or_create(id=c.id, defaults={"task_id": c.task.id})
            rows[c.id] = row
        if row.task_id != c.task.id:
            row.task_id = c.task.id
            row.save(update_fields=["task_id", "updated_at"])
    return rows


def check_eligibility(stages: list[Covered]) -> None:
    """Plan each stage's condition as the sweep sends it (with parameters, so a lone `%` in
    it, which must be written `%%`, is caught here too). Postgres unreachable is no verdict
    on a condition: OperationalError and InterfaceError go to the caller as they are."""
    for c in stages:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN {render('eligible', c.stage)}", {"item": 0})
        except (OperationalError, InterfaceError):
            raise
        except (DatabaseError, ValueError, TypeError, IndexError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise EligibilityError(
                f"task {c.task.id!r}, stage {c.id!r}: eligible_sql is not a valid condition "
                f"over the item row `mi`: {message}"
            ) from None
