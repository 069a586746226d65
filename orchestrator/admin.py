"""The Django admin: runs (read-only, plus a "Start a run" form) and API tokens.

Only the orchestrator writes run state: the start form calls `start_run` and nothing else,
and no admin page can add, change or delete a run row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import django_stubs_ext
from django import forms
from django.contrib import admin, messages
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.fields.json import KT
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from orchestrator.hooks import Refused
from orchestrator.models import ApiToken, TaskHistory
from orchestrator.start import InvalidInput, StartRefused, start_run
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Priority, TaskDefinition

_RUN_ID = re.compile(r"run_[0-9A-Za-z]{26}")

# ModelAdmin[Model] below is for the type checker; this makes it valid at run time too.
django_stubs_ext.monkeypatch()

admin.site.site_header = "Lumastra Tasks"
admin.site.site_title = "Lumastra Tasks"


class TaskFilter(admin.SimpleListFilter):
    # Choices from the registry: a DISTINCT over task_history would scan the whole table.
    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(task_id, task_id) for task_id in sorted(registry.get())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(task_id=value) if value else queryset


class TriggerKindFilter(admin.SimpleListFilter):
    title = "trigger kind"
    parameter_name = "trigger"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind.value, kind.value) for kind in TriggerKind]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        # `trigger->>'kind'` is the expression the task_history_trigger_kind index is built on;
        # `trigger__kind=` would compare JSON values and miss the index.
        by_kind: QuerySet[Any] = queryset.alias(trigger_kind=KT("trigger__kind"))
        return by_kind.filter(trigger_kind=value)


class PriorityFilter(admin.SimpleListFilter):
    title = "priority"
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(p.value), f"{p.value} {p.name.lower()}") for p in Priority]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(priority=int(value)) if value and value.isdigit() else queryset


class StartRunForm(forms.Form):
    task = forms.ChoiceField()
    input = forms.JSONField(
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


def _json_display(field_name: str) -> Callable[[Any, TaskHistory], str]:
    """A read-only detail field that shows a JSON column indented instead of on one line."""

    @admin.display(description=field_name.replace("_", " "))
    def show(model_admin: Any, run: TaskHistory) -> str:
        value = getattr(run, field_name)
        if value in (None, {}, []):
            return "-"
        return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True))

    return show


@admin.register(TaskHistory)
class TaskHistoryAdmin(admin.ModelAdmin[TaskHistory]):
    list_display = ["id", "state", "task_id", "trigger_kind", "priority", "created_at", "duration"]
    list_filter = ["state", TaskFilter, TriggerKindFilter, PriorityFilter]
    search_fields = ["task_id", "identity"]
    ordering = ["-created_at"]
    list_per_page = 50
    # Spares the second, unfiltered COUNT(*) over the whole table behind "N total".
    show_full_result_count = False
    fields = [
        ("id", "state"),
        ("task_id", "priority", "processing_version"),
        ("trigger_json", "identity"),
        "input_json",
        "result_json",
        "error_json",
        "stages_json",
        ("created_at", "started_at", "finished_at", "duration"),
        ("owner_instance_id", "attempts", "heartbeat_at"),
        "cost_breakdown_json",
        "updated_at",
    ]
    readonly_fields = [
        "duration",
        "trigger_json",
        "input_json",
        "result_json",
        "error_json",
        "stages_json",
        "cost_breakdown_json",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: TaskHistory | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: TaskHistory | None = None) -> bool:
        return False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[TaskHistory], search_term: str
    ) -> tuple[QuerySet[TaskHistory], bool]:
        # A run id is looked up by primary key; the admin's own `=id` search compares
        # UPPER(id) and would scan the table.
        term = search_term.strip()
        if _RUN_ID.fullmatch(term):
            return queryset.filter(id=f"run_{term[4:].upper()}"), False
        return super().get_search_results(request, queryset, search_term)

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskHistory]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                run_duration=ExpressionWrapper(
                    F("finished_at") - F("started_at"), output_field=DurationField()
                )
            )
        )

    trigger_json = _json_display("trigger")
    input_json = _json_display("input")
    result_json = _json_display("result")
    error_json = _json_display("error")
    stages_json = _json_display("stages")
    cost_breakdown_json = _json_display("cost_breakdown")

    @admin.display(description="trigger kind")
    def trigger_kind(self, run: TaskHistory) -> str:
        return str(run.trigger.get("kind", ""))

    @admin.display(description="duration", ordering="run_duration")
    def duration(self, run: TaskHistory) -> str | None:
        seconds = run.duration_s
        return None if seconds is None else f"{seconds:.2f} s"

    def get_urls(self) -> list[URLPattern]:
        start = path(
            "start/",
            self.admin_site.admin_view(self.start_run_view),
            name="orchestrator_taskhistory_start",
        )
        # Before the defaults: their `<path:object_id>/` would take "start/" as a run id.
        return [start, *super().get_urls()]

    def start_run_view(self, request: HttpRequest) -> HttpResponse:
        """Staff only (admin_view); the run is created by `start_run`, never here."""
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
                    self.message_user(
                        request,
                        f"A live run with this idempotency key already exists: {handle.run_id}.",
                        messages.WARNING,
                    )
                else:
                    self.message_user(
                        request,
                        f"Started {handle.task_id} as {handle.run_id} "
                        f"(priority {handle.priority}).",
                        messages.SUCCESS,
                    )
                return HttpResponseRedirect(
                    reverse("admin:orchestrator_taskhistory_change", args=[handle.run_id])
                )
        context = {
            **self.admin_site.each_context(request),
            "title": "Start a run",
            "opts": self.opts,
            "form": form,
            "tasks": [
                {
                    "id": d.id,
                    "resource_class": d.resource_class,
                    "description": d.description,
                    "schema": json.dumps(d.input_model.model_json_schema(), indent=2),
                }
                for d in definitions
            ],
        }
        return TemplateResponse(request, "admin/orchestrator/taskhistory/start_run.html", context)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    """Tokens are created by `manage.py create_api_token`, which shows the secret once."""

    list_display = ["user", "name", "prefix", "created_at", "last_used_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "name", "prefix"]
    # Never the digest: it is all a stolen database dump would need to check guesses against.
    fields = ["user", "name", "prefix", "created_at", "last_used_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False
