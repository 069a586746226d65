"""The "Start a run" page (operate permission): a task, its input, a priority and an
idempotency key; the run is created by `start_run`, never here.

`?task=<id>` chooses the task (the Tasks page links here so); the chosen task's input is then
asked field by field, the fields generated from its input schema (`input_fields`), and the
model's errors are shown on the fields they name. The whole input may instead be given as one
JSON object in "Input as JSON", which wins when it is not blank (for inputs the fields cannot
say, and for scripts that post the form). Changing the task reloads the page with the new
task's fields (`orchestrator/start_form.js`); without JavaScript, the table below the form
links each task's fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import messages
from django.forms import BoundField
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from orchestrator.admin import input_fields, pages
from orchestrator.api.access import Access
from orchestrator.hooks.base import Refused
from orchestrator.runs.handle import InvalidInput, StartRefused
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Priority, TaskDefinition


class StartRunForm(forms.Form):
    task = forms.ChoiceField()
    input = input_fields.JsonValueField(
        required=False,
        label="Input as JSON",
        widget=forms.Textarea(attrs={"rows": 6, "cols": 70, "class": "vLargeTextField"}),
        help_text="Optional: the whole input as one JSON object, used instead of the fields "
        "above when given. Empty, with no task fields, means {}.",
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

    def __init__(
        self,
        *args: Any,
        tasks: Iterable[TaskDefinition],
        chosen: TaskDefinition | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.chosen = chosen
        task_field = self.fields["task"]
        assert isinstance(task_field, forms.ChoiceField)
        listed = [(d.id, f"{d.id} ({d.resource_class})") for d in tasks]
        task_field.choices = listed if chosen else [("", "---------"), *listed]
        task_field.initial = chosen.id if chosen else None
        self.input_names: list[str] = []
        if chosen is not None:
            generated = input_fields.fields_of(chosen.input_model)
            self.fields.update(generated)
            self.input_names = list(generated)

    def task_fields(self) -> list[BoundField]:
        return [self["task"]]

    def generated_fields(self) -> list[BoundField]:
        return [self[name] for name in self.input_names]

    def other_fields(self) -> list[BoundField]:
        return [self[name] for name in ("input", "priority", "idempotency_key")]

    def json_given(self) -> bool:
        return bool(str(self.data.get("input", "")).strip())

    def run_input(self) -> Any:
        """The input to start with: the JSON when given, else what the task's fields say."""
        data = self.cleaned_data
        if self.json_given() or self.chosen is None:
            return data["input"]
        return input_fields.values_of(self.chosen.input_model, data)

    def add_input_error(self, error: dict[str, Any]) -> None:
        """A model error on the field it names, else on the JSON input."""
        loc = [str(part) for part in error.get("loc", [])]
        name = input_fields.PREFIX + loc[0] if loc else ""
        if name in self.input_names and not self.json_given():
            where = ".".join(loc[1:])
            self.add_error(name, f"{where}: {error['msg']}" if where else str(error["msg"]))
        else:
            self.add_error("input", f"{'.'.join(loc)}: {error['msg']}" if loc else error["msg"])


def _chosen(name: object) -> TaskDefinition | None:
    return registry.get().get(name) if isinstance(name, str) else None


def start_run_view(request: HttpRequest) -> HttpResponse:
    """Operate permission; the run is created by `start_run`, never here."""
    definitions = sorted(registry.get().values(), key=lambda d: d.id)
    posted = request.method == "POST"
    chosen = _chosen(request.POST.get("task") if posted else request.GET.get("task"))
    form = StartRunForm(request.POST if posted else None, tasks=definitions, chosen=chosen)
    if posted and form.is_valid():
        data = form.cleaned_data
        try:
            handle = start_run(
                data["task"],
                form.run_input(),
                trigger={"kind": TriggerKind.ADMIN.value, "actor": request.user.get_username()},
                priority=data["priority"],
                idempotency_key=data["idempotency_key"] or None,
            )
        except InvalidInput as exc:
            for error in exc.errors:
                form.add_input_error(error)
        except (StartRefused, Refused) as exc:
            form.add_error(None, str(exc))
        else:
            if handle.next_start_at is not None:
                messages.warning(
                    request,
                    f"Throttled: {handle.run_id} ran for this input within its period; the "
                    f"next may start at {handle.next_start_at:%Y-%m-%d %H:%M:%S} UTC.",
                )
            elif handle.debounced:
                messages.success(request, f"Debounced into the waiting run {handle.run_id}.")
            elif handle.coalesced:
                messages.success(
                    request,
                    f"A run of this input is running: {handle.run_id} follows it when it ends.",
                )
            elif handle.deduplicated:
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
        chosen=chosen,
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
