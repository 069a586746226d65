from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class CoverageConfig(AppConfig):
    """The media catalog stand-in and per-item coverage (docs/coverage.md)."""

    name = "coverage"
    label = "coverage"

    def ready(self) -> None:
        checks.register(_stage_conditions, checks.Tags.database)


def _stage_conditions(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """`manage.py check --database default`: each covered stage's condition plans in Postgres
    (the worker's loops refuse to start otherwise)."""
    if not databases:
        return []
    from django.db import connection

    from coverage.models import MediaItem
    from coverage.stages import EligibilityError, check_eligibility, covered

    # `migrate` runs the database checks before it creates the catalog: nothing to plan yet.
    if MediaItem._meta.db_table not in connection.introspection.table_names():
        return []

    try:
        check_eligibility(covered())
    except EligibilityError as exc:
        return [checks.Error(str(exc), id="coverage.E001")]
    return []
