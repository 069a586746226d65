"""What the Tasks page and the start form make of a definition, without a database: the start
form's fields from an input schema (`admin/input_fields.py`) and the Tasks page's words for a
schedule, a priority and a duration (`admin/tasks_page.py`)."""

from __future__ import annotations

from datetime import timedelta
from enum import Enum
from typing import Any, Literal

import pytest
from django import forms
from pydantic import BaseModel, Field

from orchestrator.admin import input_fields
from orchestrator.admin.tasks_page import duration, priority_text, schedule_text
from tasks import TaskContext, define_task
from tasks.schedule import every


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


class Inner(BaseModel):
    depth: int


class Everything(BaseModel, extra="forbid"):
    name: str = Field(description="who", max_length=10)
    count: int = Field(default=3, ge=1)
    ratio: float | None = None
    flag: bool = True
    maybe: bool | None = None
    mode: Literal["fast", "slow"] = "fast"
    level: Literal[1, 2] = 2
    colour: Colour = Colour.BLUE
    tags: list[str] = Field(default_factory=list)
    inner: Inner | None = None


def _form(data: dict[str, str] | None = None) -> forms.Form:
    form = forms.Form(data)
    form.fields.update(input_fields.fields_of(Everything))
    return form


def test_one_field_per_property_with_its_type_default_and_description() -> None:
    fields = input_fields.fields_of(Everything)

    kinds = {name: type(field) for name, field in fields.items()}
    assert kinds == {
        "input-name": forms.CharField,
        "input-count": forms.IntegerField,
        "input-ratio": forms.FloatField,
        "input-flag": forms.BooleanField,
        "input-maybe": forms.NullBooleanField,
        "input-mode": forms.TypedChoiceField,
        "input-level": forms.TypedChoiceField,
        "input-colour": forms.TypedChoiceField,
        "input-tags": input_fields.JsonValueField,
        "input-inner": input_fields.JsonValueField,
    }
    assert fields["input-name"].help_text == "who (required)"
    assert fields["input-name"].widget.attrs["maxlength"] == "10"
    assert (fields["input-count"].initial, fields["input-count"].widget.attrs["min"]) == (3, "1")
    assert fields["input-flag"].initial is True
    assert fields["input-colour"].initial == "blue"
    assert fields["input-level"].initial == "2"
    # The model, not the form, says what is required.
    assert not any(field.required for field in fields.values())


def test_posted_text_becomes_the_properties_values_and_blanks_are_left_out() -> None:
    form = _form(
        {
            "input-name": "x",
            "input-count": "",
            "input-ratio": "0.5",
            "input-maybe": "false",
            "input-mode": "slow",
            "input-level": "1",
            "input-colour": "red",
            "input-tags": '["a", "b"]',
            "input-inner": "",
        }
    )

    assert form.is_valid(), form.errors
    values: dict[str, Any] = input_fields.values_of(Everything, form.cleaned_data)
    assert values == {
        "name": "x",
        "ratio": 0.5,
        "flag": False,  # an unchecked box
        "maybe": False,
        "mode": "slow",
        "level": 1,
        "colour": "red",
        "tags": ["a", "b"],
    }
    assert Everything.model_validate(values).count == 3


def test_a_value_that_is_not_one_of_the_choices_is_refused() -> None:
    form = _form({"input-mode": "medium", "input-tags": "[1,"})

    assert not form.is_valid()
    assert set(form.errors) == {"input-mode", "input-tags"}


def _noop(ctx: TaskContext, params: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("schedule", "environ", "shown"),
    [
        (None, {}, None),
        ("0 3 * * *", {}, "cron 0 3 * * * (UTC)"),
        (every("90s"), {}, "every 90s"),
        (every("15m", env_override="X_EVERY"), {}, "every 15m"),
        (
            every("1d", env_override="X_EVERY"),
            {"X_EVERY": "6h"},
            "every 6h (from X_EVERY; declared 1d)",
        ),
    ],
)
def test_a_schedule_in_words(
    schedule: Any, environ: dict[str, str], shown: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("X_EVERY", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    definition = define_task(
        id="sample-task", resource_class="io", execute=_noop, schedule=schedule
    )

    text = schedule_text(definition)

    assert text == shown


def test_an_override_that_is_no_interval_is_shown_not_synced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("X_EVERY", "soon")
    definition = define_task(
        id="sample-task",
        resource_class="io",
        execute=_noop,
        schedule=every("1d", env_override="X_EVERY"),
    )

    text = schedule_text(definition)

    assert text is not None and text.startswith("not synced: X_EVERY='soon'")


def test_a_priority_in_words() -> None:
    assert (
        priority_text(define_task(id="a-task", resource_class="io", execute=_noop)) == "by trigger"
    )
    urgent = define_task(id="b-task", resource_class="io", execute=_noop, task_priority=1)
    assert priority_text(urgent) == "1 operator"


@pytest.mark.parametrize(
    ("span", "shown"),
    [
        (timedelta(milliseconds=420), "420 ms"),
        (timedelta(seconds=11), "11 s"),
        (timedelta(seconds=12.34), "12.3 s"),
        (timedelta(minutes=2, seconds=30), "2.5 min"),
        (timedelta(hours=3, minutes=6), "3.1 h"),
    ],
)
def test_a_duration_in_words(span: timedelta, shown: str) -> None:
    assert duration(span) == shown
