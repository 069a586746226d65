"""A run's page in the admin (view permission) and its actions (operate permission).

The page shows the run's timeline (each state it entered, from the audit the triggers write,
its last heartbeat and attempts), a pipeline's stages as a DAG (state, timings, attempts, cost
and warnings per stage), its input, result and error, links to the Markdown report, to the
run it retried and to its own retries, and — while it runs — its progress and its log,
followed live (`console.js`: the runs API for state and progress, the log's SSE stream).

Actions are CSRF-protected POSTs that call the orchestrator and write the admin log:
cancel (`request_cancel`), kill now (`request_cancel(kill=True)`: the handler is not waited
for), retry (`rerun`: a new run), and for a pipeline resume (`rerun` reusing the completed
stages) beside retry from scratch. Nothing here writes a run row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from orchestrator import tracing
from orchestrator.admin import pages
from orchestrator.api import access, report
from orchestrator.api.access import Access
from orchestrator.clock import describe
from orchestrator.hooks.base import Refused
from orchestrator.models import TaskHistory, TaskHistoryAudit
from orchestrator.recovery import windows
from orchestrator.routing import queue_name
from orchestrator.runs.cancel import CANCELLABLE, NotCancellable, UnknownRun, request_cancel
from orchestrator.runs.children import batches_of
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.rerun import RETRYABLE, rerun, retries_of
from orchestrator.states import TERMINAL_RUN_STATES, RunState, StageState
from orchestrator.stores import live
from orchestrator.text import is_run_id
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.pipeline import stage_order

RETRIES_SHOWN = 20


@dataclass(frozen=True)
class Moment:
    at: Any  # datetime
    what: str


@dataclass(frozen=True)
class StageBox:
    name: str
    state: str
    after: tuple[str, ...]
    resource_class: str
    step: dict[str, Any]


def _timeline(run: TaskHistory) -> list[Moment]:
    """Each state the run entered (the audit), then its last heartbeat while it was live."""
    changes = TaskHistoryAudit.objects.filter(run_id=run.id).order_by("id")
    moments = [
        Moment(c.at, f"{c.from_state} → {c.to_state}" if c.from_state else f"created {c.to_state}")
        for c in changes
    ]
    if run.heartbeat_at and run.state not in TERMINAL_RUN_STATES:
        moments.append(Moment(run.heartbeat_at, "last heartbeat"))
    return sorted(moments, key=lambda m: m.at)


def _levels(
    definition: TaskDefinition, run: TaskHistory, records: dict[str, dict[str, Any]]
) -> list[list[StageBox]]:
    """The pipeline's stages by depth (a stage sits one column right of its deepest
    dependency): the DAG as columns, each box with its state and step record. In dependency
    order, a stage's dependencies have their depth before it is asked."""
    depth: dict[str, int] = {}
    columns: list[list[StageBox]] = []
    for name in stage_order(definition.pipeline):
        stage = definition.stage(name)
        level = depth[name] = 1 + max((depth[d] for d in stage.after), default=-1)
        while len(columns) <= level:
            columns.append([])
        columns[level].append(
            StageBox(
                name=stage.name,
                state=str(run.stages.get(stage.name, StageState.WAITING)),
                after=stage.after,
                resource_class=stage.resource_class or definition.resource_class,
                step=records.get(stage.name, {}),
            )
        )
    return columns


def _retries(run_id: str) -> list[tuple[str, str]]:
    found = retries_of(run_id).order_by("-created_at")
    return list(found.values_list("id", "state")[:RETRIES_SHOWN])


def _current_progress(run: TaskHistory) -> SafeString | str:
    document = run.progress
    if run.state == RunState.ACTIVE:
        fresh = live.progress_of([run.id])[0]
        document = json.loads(fresh) if fresh else document
    if not isinstance(document, dict) or "done" not in document:
        return "-"
    return progress_html(document)


def _pretty(value: Any) -> str | None:
    if value in (None, {}, []):
        return None
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def progress_html(document: dict[str, Any]) -> SafeString:
    """A progress report as a bar with its count, item and ETA (the count alone without a
    total). console.js builds the same from the runs API while the run runs."""
    done, total = document.get("done", 0), document.get("total")
    eta, item = document.get("eta_s"), document.get("item")
    words = f"{done:g} of {total:g}" if total else f"{done:g} done"
    if item:
        words += f" ({item})"
    if eta is not None:
        words += f", ETA {describe(timedelta(seconds=round(eta)))}"
    if not total:
        return format_html("<span>{}</span>", words)
    return format_html(
        '<progress value="{}" max="{}"></progress> <span>{}</span>', done, total, words
    )


def detail_view(request: HttpRequest, run_id: str) -> HttpResponse:
    run = TaskHistory.objects.filter(id=run_id).first() if is_run_id(run_id) else None
    if run is None:
        raise Http404(f"no run {run_id!r}")
    definition = registry.get().get(run.task_id)
    state = RunState(run.state)
    pipeline = bool(definition and definition.pipeline)
    can_operate = access.allows(request.user, Access.OPERATE)
    error = run.error or {}
    steps = report.step_records(run)
    # The trace its start began, when traced (`orchestrator.tracing`).
    trace, trace_url = tracing.trace_id(run.trigger.get(tracing.HEADER)), settings.CONFIG.trace_url
    page = pages.context(
        request,
        f"Run {run.id}",
        run=run,
        definition=definition,
        queue=queue_name(definition, settings.CONFIG.per_task_queues) if definition else None,
        live=state not in TERMINAL_RUN_STATES,
        timeline=_timeline(run),
        columns=_levels(definition, run, {s["stage"]: s for s in steps})
        if definition and pipeline
        else [],
        steps=steps,
        input=_pretty(run.input),
        result=_pretty(run.result),
        error=error,
        error_extra=_pretty({k: v for k, v in error.items() if k not in ("kind", "message")}),
        progress=_current_progress(run),
        held=windows.held(run) if state == RunState.PENDING else None,
        retry_of=run.trigger.get("retryOf"),
        trace_id=trace,
        trace_url=trace_url.replace("{trace_id}", trace) if trace and trace_url else None,
        retries=_retries(run.id),
        children=batches_of(run.id),
        cost=run.cost_breakdown or {},
        can_operate=can_operate,
        can_cancel=can_operate and state in CANCELLABLE,
        can_kill=can_operate and state in (RunState.ACTIVE, RunState.CANCELLING),
        can_retry=can_operate and state in RETRYABLE and definition is not None,
        can_resume=can_operate
        and pipeline
        and state in RETRYABLE
        and any(s == StageState.COMPLETED for s in run.stages.values()),
    )
    return TemplateResponse(request, "admin/orchestrator/taskhistory/run_detail.html", page)


def _act(request: HttpRequest, run_id: str, action: str) -> str:
    """Does `action` through the orchestrator; returns what happened, for the operator."""
    actor = request.user.get_username()
    if action in ("cancel", "kill"):
        state = request_cancel(run_id, actor=actor, kill=action == "kill")
        verb = "killed" if action == "kill" else "cancelled"
        return f"{verb} run {run_id} (now {state})"
    handle = rerun(run_id, actor=actor, reuse=action == "resume")
    verb = {"resume": "resumed", "retry": "retried"}[action]
    return f"{verb} run {run_id} as {handle.run_id}"


def action_view(request: HttpRequest, run_id: str, action: str) -> HttpResponse:
    if action not in ("cancel", "kill", "retry", "resume") or not is_run_id(run_id):
        raise Http404(f"no action {action!r} for run {run_id!r}")
    try:
        done = _act(request, run_id, action)
    except UnknownRun as exc:
        raise Http404(str(exc)) from None
    except (NotCancellable, StartRefused, Refused) as exc:
        messages.warning(request, f"Run {run_id}: {exc}")
    else:
        pages.log_action(request, done)
        messages.success(request, done[0].upper() + done[1:] + ".")
    return HttpResponseRedirect(reverse("admin:orchestrator_taskhistory_change", args=[run_id]))


def url() -> URLPattern:
    return path(
        "<str:run_id>/act/<str:action>/",
        pages.requires(Access.OPERATE, require_POST(action_view)),
        name="orchestrator_run_act",
    )
