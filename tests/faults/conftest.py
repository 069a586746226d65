"""The fault battery's marker; the fixtures are tests.support.fixtures (pyproject addopts)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "faults: kills workers, restarts its own Valkey, cuts Postgres (tests/faults)",
    )
