"""The admin's start form answers bad input with form errors, never a 500 (issue 15, finding 2):
the same input the API answers with a 4xx."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.models import TaskHistory

pytestmark = pytest.mark.django_db

START_URL = "/admin/orchestrator/taskhistory/start/"


def _nested(depth: int) -> str:
    return '{"label": "x", "deep": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    ("depth", "error"),
    [
        # Past what Python's JSON parser takes (about a thousand levels).
        (100_000, "Enter valid JSON: it is nested too deeply."),
        # Parsed, then refused by the task's input model (no `deep` field). The parser's limit
        # counts the frames of the request's path too, so this stays well inside it.
        (500, "deep: Extra inputs are not permitted"),
    ],
)
def test_deeply_nested_input_is_a_form_error(admin_client: Any, depth: int, error: str) -> None:
    response = admin_client.post(START_URL, {"task": "test-record-order", "input": _nested(depth)})

    assert response.status_code == 200
    assert error in response.content.decode()
    assert not TaskHistory.objects.exists()
