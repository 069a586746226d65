"""The Django admin: runs (read-only, plus a "Start a run" form), the "Tasks" status page
(with a force-enable button per circuit), the "Nodes" page (live nodes and leaders, read-only)
and API tokens.

Every run page and action checks `orchestrator.api.access` like the API does: reading (the runs
list and detail, Tasks, Nodes) needs view, acting (start, cancel, retry, force-enable) needs
operate; staff without the permission get a 403. The site's login counts failed sign-ins per
client address with the API's bearer tokens (`orchestrator.api.throttle`).

Only the orchestrator writes run state: the start form calls `start_run` and nothing else,
the force-enable button `circuit.force_enable` and nothing else, and no admin page can add,
change or delete a run row.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import django_stubs_ext
from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.fields.json import KT
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from orchestrator.api import access, throttle
from orchestrator.api.access import Access
from orchestrator.cluster import leaders, roster
from orchestrator.hooks import circuit, overview
from orchestrator.hooks.base import Refused
from orchestrator.models import ApiToken, TaskHistory
from orchestrator.runs import drain
from orchestrator.runs.cancel import NotCancellable, UnknownRun, request_cancel
from orchestrator.runs.rerun import retry_run
from orchestrator.runs.start import InvalidInput, StartRefused, start_run
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Priority, TaskDefinition
from tasks.registry import UnknownTaskError

_RUN_ID = re.compile(r"run_[0-9A-Za-z]{26}")

# ModelAdmin[Model] below is for the type checker; this makes it valid at run time too.
django_stubs_ext.monkeypatch()

admin.site.site_header = "Lumastra Tasks"
admin.site.site_title = "Lumastra Tasks"


def _throttled_login(login: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The admin login with its failures counted against the client address's sign-in budget
    (shared with API tokens); past it, a sign-in is refused with 429 before it is checked."""

    @functools.wraps(login)
    def view(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method != "POST":
            return login(request, extra_context)
        address = throttle.client_address(request)
        wait = throttle.blocked_for(address)
        if wait is not None:
            context = {
                **admin.site.each_context(request),
                "title": "Log in",
                "detail": throttle.refusal(wait),
            }
            refused = TemplateResponse(
                request, "admin/orchestrator/login_throttled.html", context, status=429
            )
            refused["Retry-After"] = str(math.ceil(wait.total_seconds()))
            return refused
        response = login(request, extra_context)
        # Django's LoginView redirects after a sign-in and shows the form again after a
        # failed one (wrong credentials, or an account that may not use the admin).
        if response.status_code == 200:
            throttle.record_failure(address)
        return response

    return view


# The admin site builds its URLs from this attribute, after the apps (and so this module) load.
admin.site.login = _throttled_login(admin.site.login)  # type: ignore[method-assign]


POISON_SHOWN = 50


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


class OutcomeFilter(admin.SimpleListFilter):
    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("dead-letter", "dead letters (retries exhausted)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "dead-letter":
            return queryset.filter(state="failed", error__exhausted=True)
        return queryset


class PriorityFilter(admin.SimpleListFilter):
    title = "priority"
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(p.value), f"{p.value} {p.name.lower()}") for p in Priority]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(priority=int(value)) if value and value.isdigit() else queryset


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


def _span(span: timedelta) -> str:
    seconds = math.ceil(span.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"


@dataclass(frozen=True)
class _NodeRow:
    node: roster.Node
    age: str
    leads: tuple[str, ...]  # the seats this node holds


@dataclass(frozen=True)
class _SeatRow:
    seat: str
    instance_id: str | None
    live: bool  # the leader is in the roster (False: none, or its announcement expired)


def _age(started: datetime | None, now: datetime) -> str:
    return "-" if started is None else _span(max(timedelta(0), now - started))


@dataclass(frozen=True)
class _TaskRow:
    definition: TaskDefinition
    status: overview.TaskStatus
    half_open_in: str | None  # while the circuit is open

    @classmethod
    def of(cls, definition: TaskDefinition, status: overview.TaskStatus) -> _TaskRow:
        wait = status.circuit.time_to_half_open
        return cls(definition, status, None if wait is None else _span(wait))


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
                self.message_user(request, f"{run_id}: {state}")

    @admin.action(
        description="Retry selected runs (new runs at priority 1)", permissions=["operate"]
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[TaskHistory]) -> None:
        for run_id in queryset.values_list("id", flat=True):
            try:
                handle = retry_run(run_id, actor=request.user.get_username())
            except (StartRefused, Refused, UnknownRun) as exc:
                self.message_user(request, f"{run_id}: {exc}", messages.WARNING)
            else:
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

    def _requires(
        self, needed: Access, view: Callable[..., HttpResponse]
    ) -> Callable[..., HttpResponse]:
        """`view` behind the admin's login (active staff, else a redirect to it) and `needed`
        (else 403)."""

        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not access.allows(request.user, needed):
                raise PermissionDenied(access.refusal(needed))
            return view(request, *args, **kwargs)

        return self.admin_site.admin_view(guarded)

    def get_urls(self) -> list[URLPattern]:
        start = path(
            "start/",
            self._requires(Access.OPERATE, self.start_run_view),
            name="orchestrator_taskhistory_start",
        )
        tasks = path(
            "tasks/", self._requires(Access.VIEW, self.tasks_view), name="orchestrator_tasks"
        )
        force_enable = path(
            "tasks/<str:task_id>/force-enable/",
            self._requires(Access.OPERATE, require_POST(self.force_enable_view)),
            name="orchestrator_task_force_enable",
        )
        nodes = path(
            "nodes/", self._requires(Access.VIEW, self.nodes_view), name="orchestrator_nodes"
        )
        # Before the defaults: their `<path:object_id>/` would take "start/" or "tasks/" as a
        # run id.
        return [start, tasks, force_enable, nodes, *super().get_urls()]

    def nodes_view(self, request: HttpRequest) -> HttpResponse:
        """View permission: the node roster and the leader of each seat, read-only."""
        now = datetime.now(UTC)
        nodes = sorted(roster.roster(), key=lambda n: (n.role, n.host, n.pid))
        leading = leaders.leaders()
        by_instance: dict[str, list[str]] = {}
        for seat, instance in leading.items():
            by_instance.setdefault(instance, []).append(seat)
        live = {n.instance_id for n in nodes}
        context = {
            **self.admin_site.each_context(request),
            "title": "Nodes",
            "opts": self.opts,
            "nodes": [
                _NodeRow(n, _age(n.started, now), tuple(by_instance.get(n.instance_id, ())))
                for n in nodes
            ],
            "seats": [
                _SeatRow(seat, leading.get(seat), leading.get(seat) in live)
                for seat in leaders.all_seats()
            ],
        }
        return TemplateResponse(request, "admin/orchestrator/nodes.html", context)

    def tasks_view(self, request: HttpRequest) -> HttpResponse:
        """View permission: every task's admission status; the force-enable buttons are shown
        to operators only."""
        definitions = sorted(registry.get().values(), key=lambda d: d.id)
        statuses = overview.task_statuses(definitions)
        context = {
            **self.admin_site.each_context(request),
            "title": "Tasks",
            "opts": self.opts,
            "rows": [
                _TaskRow.of(definition, statuses[definition.id]) for definition in definitions
            ],
            # Terminal writes the drain gave up on: runs whose end Postgres never recorded.
            "poisoned": drain.poisoned(POISON_SHOWN),
            "can_operate": self.has_operate_permission(request),
        }
        return TemplateResponse(request, "admin/orchestrator/tasks.html", context)

    def force_enable_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        """Operate permission, POST with a CSRF token (require_POST); the circuit is changed by
        `circuit.force_enable` under the operator's name, never here."""
        try:
            forced = circuit.force_enable(task_id, actor=request.user.get_username())
        except UnknownTaskError as exc:
            raise Http404(str(exc)) from None
        until = forced.forced_until
        self.message_user(
            request,
            f"The circuit of {task_id} is closed and force-enabled"
            + (f" until {until:%Y-%m-%d %H:%M:%S} UTC." if until else "."),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:orchestrator_tasks"))

    def start_run_view(self, request: HttpRequest) -> HttpResponse:
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
