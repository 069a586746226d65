"""The admin's start form asks for the chosen task's input field by field, the fields made
from the task's input schema at render time, and lets the task's model judge the input:
`?task=` chooses the task, a blank field takes the model's default, the model's errors land on
the fields they name, and "Input as JSON" still takes a whole input."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from orchestrator.models import TaskHistory

pytestmark = pytest.mark.django_db

START_URL = "/admin/orchestrator/taskhistory/start/"


def _field(page: str, name: str) -> str:
    """The HTML of the form control named `name`."""
    found = re.search(rf'<(input|select|textarea)[^>]*name="{re.escape(name)}"[^>]*>', page)
    assert found, f"no field {name!r} on the page"
    return found.group(0)


def _row_of(page: str, name: str) -> str:
    """The form row of the field `name`, errors and help included."""
    start = page.rindex('<div class="form-row', 0, page.index(f'name="{name}"'))
    return page[start : page.index('<div class="form-row', start + 1)]


def _start(client: Client, task: str, **fields: str) -> Any:
    return client.post(START_URL, {"task": task, "input": "", "priority": "", **fields})


def test_the_task_in_the_query_is_chosen_and_its_input_asked_field_by_field(
    admin_client: Client,
) -> None:
    page = admin_client.get(f"{START_URL}?task=demo-pipeline").content.decode()

    assert '<option value="demo-pipeline" selected>' in page
    assert '<option value=""' not in _row_of(page, "task")
    assert "<h2>Input of demo-pipeline</h2>" in page
    # One field per property of the input model, in its order, with its type and default.
    names = re.findall(r'name="input-([a-z_]+)"', page)
    assert names == ["path", "fail_stage", "skip_index", "stage_sleep_s", "max_files"]
    assert 'type="text"' in _field(page, "input-path")
    assert "(required)" in _row_of(page, "input-path")
    assert "folder below a media root whose files are processed" in _row_of(page, "input-path")
    max_files = _field(page, "input-max_files")
    assert 'type="number"' in max_files and 'value="200"' in max_files
    assert 'min="1"' in max_files and 'max="500"' in max_files
    assert 'type="checkbox"' in _field(page, "input-skip_index")
    assert "checked" not in _field(page, "input-skip_index")
    # A Literal | None is a choice of its values, blank for None.
    choices = _row_of(page, "input-fail_stage")
    assert re.findall(r'<option value="([^"]*)"', choices) == [
        "",
        "probe",
        "checksum",
        "index",
        "summary",
    ]


def test_without_a_known_task_nothing_is_chosen(admin_client: Client) -> None:
    for url in (START_URL, f"{START_URL}?task=no-such-task"):
        page = admin_client.get(url).content.decode()

        assert '<option value="" selected>' in page
        assert "Input of" not in page
        assert 'name="input-' not in page
        # Each task's fields are a link away.
        assert '<a href="?task=slow-progress">slow-progress</a>' in page


def test_a_run_starts_from_the_fields_with_the_models_defaults_for_blanks(
    admin_client: Client,
) -> None:
    response = _start(
        admin_client, "slow-progress", **{"input-steps": "3", "input-step_seconds": ""}
    )

    run = TaskHistory.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/admin/orchestrator/taskhistory/{run.id}/change/"
    assert run.input == {"steps": 3, "step_seconds": 0.5}
    assert run.trigger == {"kind": "admin", "actor": "admin"}


def test_choices_and_checkboxes_become_the_models_values(admin_client: Client) -> None:
    _start(admin_client, "test-circuit", **{"input-how": "fatal"})
    # `progress` (default True) unchecked: posted as nothing, meaning False.
    _start(admin_client, "test-sleepy", **{"input-seconds": "0.25", "input-cooperative": "on"})

    inputs = {run.task_id: run.input for run in TaskHistory.objects.all()}
    assert inputs == {
        "test-circuit": {"how": "fatal"},
        "test-sleepy": {"seconds": 0.25, "cooperative": True, "progress": False},
    }


def test_a_refused_input_is_shown_back_as_typed(admin_client: Client) -> None:
    page = _start(
        admin_client,
        "demo-pipeline",
        **{"input-fail_stage": "checksum", "input-skip_index": "on", "input-max_files": "7"},
    ).content.decode()

    assert not TaskHistory.objects.exists()
    assert "Field required" in _row_of(page, "input-path")
    assert "checked" in _field(page, "input-skip_index")
    assert 'value="7"' in _field(page, "input-max_files")
    assert '<option value="checksum" selected>' in _row_of(page, "input-fail_stage")


@pytest.mark.parametrize(
    ("fields", "name", "error"),
    [
        # Refused by the model: shown on the field it names.
        ({"input-steps": "0"}, "input-steps", "Input should be greater than or equal to 1"),
        ({"input-step_seconds": "9"}, "input-step_seconds", "Input should be less than or equal"),
        # Not a number at all: the field's own parse.
        ({"input-steps": "many"}, "input-steps", "Enter a whole number."),
    ],
)
def test_the_models_errors_are_shown_on_the_fields_and_nothing_starts(
    admin_client: Client, fields: dict[str, str], name: str, error: str
) -> None:
    response = _start(admin_client, "slow-progress", **fields)

    assert response.status_code == 200
    assert error in _row_of(response.content.decode(), name)
    assert not TaskHistory.objects.exists()


def test_a_required_field_left_blank_is_the_models_field_required(admin_client: Client) -> None:
    page = _start(admin_client, "epg-refresh", **{"input-source": "news"}).content.decode()

    assert "Field required" in _row_of(page, "input-url")
    assert "Field required" not in _row_of(page, "input-source")
    assert not TaskHistory.objects.exists()


def test_input_as_json_wins_over_the_fields(admin_client: Client) -> None:
    _start(
        admin_client,
        "slow-progress",
        input='{"steps": 4}',
        **{"input-steps": "9", "input-step_seconds": "1"},
    )

    assert TaskHistory.objects.get().input == {"steps": 4, "step_seconds": 0.5}
