"""Form fields generated from a task's input schema, for the start form.

The schema is the JSON Schema pydantic makes of the task's `input_model` (the one the API
publishes), read at render time, so the form cannot drift from the definition. One field per
property, labelled with its title, its description as help, its default as the initial value
and its bounds on the widget:

- string → text; an enum or a `Literal` → a choice of its values;
- integer, number → a number input; boolean → a checkbox;
- one of those or null (`X | None`) → the same, a blank meaning "not given";
- anything else (objects, lists, unions) → that property's value as JSON.

The fields only turn the posted text into values of the property's type. Whether the input is
valid is the model's call: `start_run` validates the whole input with it, and the start form
shows each of its errors on the field it names. A blank field is left out of the input, so
the model's default applies, or its "Field required" is shown on the field.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from django import forms
from pydantic import BaseModel

from orchestrator.text import first_unstorable

PREFIX = "input-"  # form field names: `input-<property>` (Django's form prefix style)


class JsonValueField(forms.JSONField):
    """A JSON document that Python parses and Postgres stores, else a form error shown back as
    typed. Django's field expects only `JSONDecodeError` from the parser, which also gives up
    with RecursionError past about a thousand levels and ValueError on a number longer than
    `sys.get_int_max_str_digits()`; and a `\\u` escape can carry a lone surrogate, which no
    page or store can encode."""

    default_error_messages = {
        "too_deep": "Enter valid JSON: it is nested too deeply.",
        "too_long": "Enter valid JSON: a number has more than {digits} digits.",
        "unstorable": "Enter valid JSON: {where} {reason}.",
    }

    def to_python(self, value: Any) -> Any:
        try:
            parsed = super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep") from None
        except ValueError:  # not a JSONDecodeError: Django's field turned those into its own
            message = self.error_messages["too_long"].format(digits=sys.get_int_max_str_digits())
            raise forms.ValidationError(message, code="too_long") from None
        if found := first_unstorable(parsed):
            loc, reason = found
            # A key can be the lone surrogate: shown escaped, as the JSON had it.
            where = ".".join(map(str, loc)).encode(errors="backslashreplace").decode() or "the text"
            message = self.error_messages["unstorable"].format(where=where, reason=reason)
            raise forms.ValidationError(message, code="unstorable")
        return parsed

    def prepare_value(self, value: Any) -> Any:
        # Nothing given is shown blank, not as `null`.
        return "" if value is None else super().prepare_value(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        # Shown back as typed, like any other text that is not JSON.
        try:
            parsed = super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return forms.fields.InvalidJSONInput(data)
        return forms.fields.InvalidJSONInput(data) if first_unstorable(parsed) else parsed


_NULL = {"type": "null"}
_BOUNDS = {
    "minimum": "min",
    "maximum": "max",
    "maxLength": "maxlength",
    "minLength": "minlength",
    "pattern": "pattern",
}


def fields_of(model: type[BaseModel]) -> dict[str, forms.Field]:
    """The form fields of `model`'s input schema, by form field name, in the model's order."""
    schema = model.model_json_schema()
    definitions: Mapping[str, Any] = schema.get("$defs", {})
    required = set(schema.get("required", ()))
    return {
        PREFIX + name: field_for(name, prop, required=name in required, definitions=definitions)
        for name, prop in schema.get("properties", {}).items()
    }


def values_of(model: type[BaseModel], cleaned: Mapping[str, Any]) -> dict[str, Any]:
    """The input the generated fields of `model` say: every field not left blank."""
    found = {}
    for name in model.model_json_schema().get("properties", {}):
        value = cleaned.get(PREFIX + name)
        if value is not None and value != "":
            found[name] = value
    return found


def _resolved(prop: Mapping[str, Any], definitions: Mapping[str, Any]) -> dict[str, Any]:
    """`prop` with a `$ref` (an Enum, a nested model) replaced by what it names, keeping the
    property's own keys (its default, its description)."""
    ref = prop.get("$ref")
    if not isinstance(ref, str):
        return dict(prop)
    target = definitions.get(ref.rsplit("/", 1)[-1], {})
    return {**target, **{key: value for key, value in prop.items() if key != "$ref"}}


def _without_null(
    prop: dict[str, Any], definitions: Mapping[str, Any]
) -> tuple[dict[str, Any], bool]:
    """(`X`, True) for `X | None`, else (`prop`, False)."""
    options = prop.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and _NULL in options:
        other = _resolved(next(o for o in options if o != _NULL), definitions)
        rest = {key: value for key, value in prop.items() if key != "anyOf"}
        return {**other, **rest}, True
    return prop, False


def field_for(
    name: str, prop: Mapping[str, Any], *, required: bool, definitions: Mapping[str, Any]
) -> forms.Field:
    """The form field of one property of an input schema."""
    schema, nullable = _without_null(_resolved(prop, definitions), definitions)
    default = schema.get("default")
    help_parts = [str(schema["description"])] if schema.get("description") else []
    if required:
        help_parts.append("(required)")
    common: dict[str, Any] = {
        "required": False,  # the model says what is required, on the field it names
        "label": schema.get("title") or name,
        "help_text": " ".join(help_parts),
    }
    kind = schema.get("type")
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(choices, list):
        by_text = {_text(value): value for value in choices}
        return forms.TypedChoiceField(
            choices=[("", "---------")] + [(text, text) for text in by_text],
            coerce=by_text.__getitem__,
            empty_value=None,
            initial=None if default is None else _text(default),
            **common,
        )
    attrs = {html: str(schema[key]) for key, html in _BOUNDS.items() if key in schema}
    if kind == "boolean":
        if nullable:
            return forms.NullBooleanField(initial=default, **common)
        return forms.BooleanField(initial=bool(default), **common)
    if kind == "integer":
        return forms.IntegerField(initial=default, widget=forms.NumberInput(attrs), **common)
    if kind == "number":
        number = forms.NumberInput({"step": "any", **attrs})
        return forms.FloatField(initial=default, widget=number, **common)
    if kind == "string":
        text = forms.TextInput({**attrs, "size": "60"})
        return forms.CharField(initial=default, strip=False, widget=text, **common)
    common["help_text"] = " ".join([*help_parts, "As JSON."])
    return JsonValueField(
        initial=default,
        widget=forms.Textarea({"rows": 3, "cols": 60, "class": "vLargeTextField"}),
        **common,
    )


def _text(value: Any) -> str:
    # Choices travel as text; a string choice as itself, any other value as its JSON.
    return value if isinstance(value, str) else json.dumps(value)
