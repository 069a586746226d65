"""Runs in the admin: the list (filters, search by run id and by input fields and tags, bulk
cancel and retry of the chosen or the whole filtered list, progress and
ETA of running runs from their live hashes, refreshed in place by `console.js`) and each run's
page (`run_detail`). The operator pages live beside it, one module each, under the runs' URLs
(`start/`, `tasks/`, `nodes/`, …)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime

from orchestrator.admin import (
    dead_letters,
    force_enable,
    limits_page,
    nodes,
    pages,
    pause,
    providers_page,
    run_detail,
    schedules,
    start_form,
    tasks_page,
)
from orchestrator.admin.filters import (
    OutcomeFilter,
    ParentFilter,
    PriorityFilter,
    ResourceClassFilter,
    TaskFilter,
    TriggerKindFilter,
)
from orchestrator.admin.paginator import EstimatedCountPaginator
from orchestrator.api import access, report
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from orchestrator.runs import bulk, search
from orchestrator.states import RunState
from orchestrator.stores import live
from tasks import registry

# The created_at filter's own parameters: the date range form sets them.
DATE_RANGE = ("created_at__gte", "created_at__lt")
_RUN_ID = re.compile(r"run_[0-9A-Za-z]{26}")
# An action on this many runs or fewer says how each went; on more, how many went each way.
_MESSAGES_PER_RUN = 20


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
    list_display = [
        "id",
        "state_badge",
        "task_id",
        "resource_class",
        "trigger_kind",
        "priority",
        "progress_bar",
        "duration",
        "cost",
        "error_kind",
        "created_at",
    ]
    list_filter = [
        "state",
        OutcomeFilter,
        TaskFilter,
        ResourceClassFilter,
        TriggerKindFilter,
        PriorityFilter,
        ParentFilter,
        ("created_at", admin.DateFieldListFilter),
    ]
    search_fields = ["task_id", "identity"]
    search_help_text = (
        "A run id, a task or an identity; or what runs were about: input fields and tags, "
        "e.g. library_id=7 #nightly"
    )
    ordering = ["-created_at"]
    list_per_page = 50
    # Counting a filter's rows reads them all: past 10,000 the planner's estimate is shown.
    paginator = EstimatedCountPaginator
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

    class Media:
        js = ["orchestrator/console.js"]

    @admin.action(description="Cancel selected runs", permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[TaskHistory]) -> None:
        # The orchestrator owns run state: the API's bulk cancel, on the chosen runs.
        done = bulk.cancel(search.RunFilter(), actor=request.user.get_username(), runs=queryset)
        self._report(request, queryset, done, "cancelled run", "live")

    @admin.action(
        description="Retry selected runs (new runs at priority 1)", permissions=["operate"]
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[TaskHistory]) -> None:
        done = bulk.retry(search.RunFilter(), actor=request.user.get_username(), runs=queryset)
        self._report(request, queryset, done, "retried run", "failed or cancelled, not retried yet")

    def _report(
        self,
        request: HttpRequest,
        queryset: QuerySet[TaskHistory],
        done: bulk.Bulk,
        logged: str,
        acts_on: str,
    ) -> None:
        """What an action on the chosen runs (all a filtered list holds, with "select all")
        did: logged per run; a message per run for a few, a count per outcome for many."""
        outcomes: Counter[str] = Counter()
        few = len(done.items) <= _MESSAGES_PER_RUN
        for acted in done.items:
            outcomes[acted.outcome] += 1
            if acted.outcome in ("refused", "error"):
                said, level = acted.detail, messages.WARNING
            else:
                said = f"retried as {acted.new_run_id}" if acted.new_run_id else acted.outcome
                level = messages.INFO
                now = f"as {acted.new_run_id}" if acted.new_run_id else f"(now {acted.outcome})"
                pages.log_action(request, f"{logged} {acted.run_id} {now}")
            if few:
                self.message_user(request, f"Run {acted.run_id}: {said}", level)
        if not few:
            counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items()))
            self.message_user(request, f"{len(done.items)} runs: {counts}")
        if left := queryset.count() - done.matched:
            self.message_user(
                request, f"{left} of the chosen runs are not {acts_on}: left as they are"
            )
        if done.more:
            self.message_user(
                request,
                f"At most {bulk.BULK_MAX} runs an action: do it again for the rest",
                messages.WARNING,
            )

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
        response = super().changelist_view(
            request,
            {
                **(extra_context or {}),
                "can_operate": can_operate,
                "date_range": {k: request.GET.get(k, "") for k in DATE_RANGE},
                "date_range_keep": [(k, v) for k, v in request.GET.items() if k not in DATE_RANGE],
            },
        )
        changelist = getattr(response, "context_data", {}).get("cl")
        if changelist is not None:
            _attach_live_progress(changelist.result_list)
        return response

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # The run's own page instead of a read-only form: runs are never edited here.
        if not self.has_view_permission(request):
            raise PermissionDenied(access.refusal(Access.VIEW))
        return run_detail.detail_view(request, object_id)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[TaskHistory], search_term: str
    ) -> tuple[QuerySet[TaskHistory], bool]:
        # A run id is looked up by primary key; the admin's own `=id` search compares
        # UPPER(id) and would scan the table.
        term = search_term.strip()
        if _RUN_ID.fullmatch(term):
            return queryset.filter(id=f"run_{term[4:].upper()}"), False
        if "=" in term or term.startswith("#"):
            # What the runs were about: `library_id=7 #nightly` (`runs.search`).
            try:
                return search.matching(search.search_terms(term), queryset), False
            except search.BadFilter as exc:
                self.message_user(request, f"Search: {exc}", messages.ERROR)
                return queryset.none(), False
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

    @admin.display(description="state", ordering="state")
    def state_badge(self, run: TaskHistory) -> str:
        badge = format_html('<span class="run-state state-{0}">{0}</span>', run.state)
        if run.state == RunState.PENDING and run.not_before is not None:
            # A delayed start, or a retry waiting for its backoff.
            when = date_format(localtime(run.not_before), "Y-m-d H:i:s e")
            return format_html(
                '{} <span class="run-scheduled">scheduled for {}</span>', badge, when
            )
        return badge

    @admin.display(description="class")
    def resource_class(self, run: TaskHistory) -> str:
        # From the registry at render time: a task removed since shows nothing.
        definition = registry.get().get(run.task_id)
        return definition.resource_class if definition else "-"

    @admin.display(description="progress")
    def progress_bar(self, run: TaskHistory) -> str:
        document = getattr(run, "live_progress", None) or run.progress
        if not isinstance(document, dict) or "done" not in document:
            return "-"
        return format_html(
            '<span class="run-progress" data-run="{}">{}</span>',
            run.id,
            run_detail.progress_html(document),
        )

    @admin.display(description="cost")
    def cost(self, run: TaskHistory) -> str:
        spent = run.cost_breakdown or {}
        return ", ".join(f"{kind} {units:g}" for kind, units in sorted(spent.items())) or "-"

    @admin.display(description="error")
    def error_kind(self, run: TaskHistory) -> str:
        error = run.error or {}
        kind = str(error.get("kind", ""))
        return kind + (" (dead letter)" if error.get("exhausted") else "") if kind else "-"

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
        operator_pages = [
            page.url()
            for page in (
                start_form,
                tasks_page,
                force_enable,
                pause,
                nodes,
                limits_page,
                providers_page,
                run_detail,
                dead_letters,
                schedules,
            )
        ]
        return [*operator_pages, *super().get_urls()]


def _attach_live_progress(rows: Any) -> None:
    """The running runs' progress from their live hashes (fresher than their rows), in one
    round trip, for `progress_bar`."""
    running = [run for run in rows if run.state == RunState.ACTIVE]
    if not running:
        return
    for run, fresh in zip(running, live.progress_of([r.id for r in running]), strict=True):
        if fresh:
            run.live_progress = json.loads(fresh)
