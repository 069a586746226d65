"""The "Start a run" page (operate permission): a task, its input as JSON, a priority and an
idempotency key; the run is created by `start_run`, never here."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from orchestrator.admin import pages
from orchestrator.api.access import Access
from orchestrator.hooks.base import Refused
from orchestrator.runs.start import InvalidInput, StartRefused, start_run
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Priority, TaskDefinition


class _InputField(forms.JSONField):
    """A JSON field that refuses a document too deep for Python's parser as invalid JSON: the
    parser gives up past about a thousand levels with RecursionError, which Django's field
    does not expect."""

    default_error_messages = {"too_deep": "Enter valid JSON: it is nested too deeply."}

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        # Shown back as typed, like any other text that is not JSON.
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return forms.fields.InvalidJSONInput(data)


class StartRunForm(forms.Form):
    task = forms.ChoiceField()
    input = _InputField(
        required=False,
        initial=dict,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 70, "class": "vLargeTextField"}),
        help_text="A JSON object for the task's input; empty means {}.",
    )
    priority = forms.TypedChoiceField(
        required=False,
        coerce=int,
        empty_value=None,
        choices=[("", "default (the task's, else from the trigger)")]
        + [(p.value, f"{p.value} {p.name.lower()}") for p in Priority],
        help_text="Lower is more urgent.",
    )
    idempotency_key = forms.CharField(
        required=False,
        max_length=200,
        help_text="While a run of this task with this key is live, it is returned instead.",
    )

    def __init__(self, *args: Any, tasks: Iterable[TaskDefinition], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        task_field = self.fields["task"]
        assert isinstance(task_field, forms.ChoiceField)
        task_field.choices = [(d.id, f"{d.id} ({d.resource_class})") for d in tasks]


def _describe(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", []))
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def start_run_view(request: HttpRequest) -> HttpResponse:
    """Operate permission; the run is created by `start_run`, never here."""
    definitions = sorted(registry.get().values(), key=lambda d: d.id)
    form = StartRunForm(request.POST or None, tasks=definitions)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            handle = start_run(
                data["task"],
                data["input"],
                trigger={"kind": TriggerKind.ADMIN.value, "actor": request.user.get_username()},
                priority=data["priority"],
                idempotency_key=data["idempotency_key"] or None,
            )
        except InvalidInput as exc:
            for error in exc.errors:
                form.add_error("input", _describe(error))
        except (StartRefused, Refused) as exc:
            form.add_error(None, str(exc))
        else:
            if handle.deduplicated:
                messages.warning(
                    request,
                    f"A live run with this idempotency key already exists: {handle.run_id}.",
                )
            else:
                pages.log_action(request, f"started {handle.task_id} as {handle.run_id}")
                messages.success(
                    request,
                    f"Started {handle.task_id} as {handle.run_id} (priority {handle.priority}).",
                )
            return HttpResponseRedirect(
                reverse("admin:orchestrator_taskhistory_change", args=[handle.run_id])
            )
    page = pages.context(
        request,
        "Start a run",
        form=form,
        tasks=[
            {
                "id": d.id,
                "resource_class": d.resource_class,
                "description": d.description,
                "schema": json.dumps(d.input_model.model_json_schema(), indent=2),
            }
            for d in definitions
        ],
    )
    return TemplateResponse(request, "admin/orchestrator/taskhistory/start_run.html", page)


def url() -> URLPattern:
    return path(
        "start/",
        pages.requires(Access.OPERATE, start_run_view),
        name="orchestrator_taskhistory_start",
    )
