"""Runs in the admin: the list (filters, search by run id, cancel and retry actions) and each
run's read-only detail. The operator pages live beside it, one module each, under the runs'
URLs (`start/`, `tasks/`, `nodes/`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, reverse
from django.utils.html import format_html

from orchestrator.admin import force_enable, nodes, pages, start_form, tasks_page
from orchestrator.admin.filters import OutcomeFilter, PriorityFilter, TaskFilter, TriggerKindFilter
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.hooks.base import Refused
from orchestrator.models import TaskHistory
from orchestrator.runs import report
from orchestrator.runs.cancel import NotCancellable, UnknownRun, request_cancel
from orchestrator.runs.rerun import rerun
from orchestrator.runs.start import StartRefused

_RUN_ID = re.compile(r"run_[0-9A-Za-z]{26}")


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
    list_filter = ["state", OutcomeFilter, TaskFilter, TriggerKindFilter, PriorityFilter]
    search_fields = ["task_id", "identity"]
    ordering = ["-created_at"]
    list_per_page = 50
    # Spares the second, unfiltered COUNT(*) over the whole table behind "N total".
    show_full_result_count = False
    fields = [
        ("id", "state", "report"),
        ("task_id", "priority", "processing_version"),
        ("trigger_json", "identity"),
        "input_json",
        "result_json",
        "error_json",
        "stages_json",
        "steps_json",
        ("created_at", "started_at", "finished_at", "duration"),
        ("owner_instance_id", "attempts", "heartbeat_at"),
        "cost_breakdown_json",
        "updated_at",
    ]
    readonly_fields = [
        "report",
        "steps_json",
        "duration",
        "trigger_json",
        "input_json",
        "result_json",
        "error_json",
        "stages_json",
        "cost_breakdown_json",
    ]

    actions = ["cancel_runs", "retry_runs"]

    @admin.action(description="Cancel selected runs", permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[TaskHistory]) -> None:
        # The orchestrator owns run state: each run goes through request_cancel.
        for run_id in queryset.values_list("id", flat=True):
            try:
                state = request_cancel(run_id, actor=request.user.get_username())
            except (NotCancellable, UnknownRun) as exc:
                self.message_user(request, str(exc), messages.WARNING)
            else:
                pages.log_action(request, f"cancelled run {run_id} (now {state})")
                self.message_user(request, f"{run_id}: {state}")

    @admin.action(
        description="Retry selected runs (new runs at priority 1)", permissions=["operate"]
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[TaskHistory]) -> None:
        for run_id in queryset.values_list("id", flat=True):
            try:
                handle = rerun(run_id, actor=request.user.get_username())
            except (StartRefused, Refused, UnknownRun) as exc:
                self.message_user(request, f"{run_id}: {exc}", messages.WARNING)
            else:
                pages.log_action(request, f"retried run {run_id} as {handle.run_id}")
                self.message_user(request, f"{run_id}: retried as {handle.run_id}")

    def has_view_permission(self, request: HttpRequest, obj: TaskHistory | None = None) -> bool:
        return access.allows(request.user, Access.VIEW)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Django asks this for the actions marked `permissions=["operate"]`."""
        return access.allows(request.user, Access.OPERATE)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: TaskHistory | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: TaskHistory | None = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        can_operate = self.has_operate_permission(request)
        # Django leaves an action the user may not run out of the list and shows the page
        # again as if nothing was posted; a posted one is refused like the other operate pages.
        posted = request.POST.get("action") if request.method == "POST" else None
        if posted in self.actions and not can_operate:
            raise PermissionDenied(access.refusal(Access.OPERATE))
        return super().changelist_view(
            request, {**(extra_context or {}), "can_operate": can_operate}
        )

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

    @admin.display(description="report")
    def report(self, run: TaskHistory) -> str:
        url = reverse("api-v1:run_report", kwargs={"run_id": run.id})
        return format_html('<a href="{}">Markdown report (steps, error, warnings)</a>', url)

    @admin.display(description="steps")
    def steps_json(self, run: TaskHistory) -> str:
        records = report.step_records(run)
        return format_html("<pre>{}</pre>", json.dumps(records, indent=2, sort_keys=True))

    def get_urls(self) -> list[URLPattern]:
        # Before the defaults: their `<path:object_id>/` would take "start/" or "tasks/" as a
        # run id.
        operator_pages = [page.url() for page in (start_form, tasks_page, force_enable, nodes)]
        return [*operator_pages, *super().get_urls()]
