"""Force-enable a task's circuit (operate permission, POST with a CSRF token): the circuit is
changed by `circuit.force_enable` under the operator's name, never here."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_POST

from orchestrator.admin import pages
from orchestrator.api.access import Access
from orchestrator.hooks import circuit
from tasks.registry import UnknownTaskError


def force_enable_view(request: HttpRequest, task_id: str) -> HttpResponse:
    try:
        forced = circuit.force_enable(task_id, actor=request.user.get_username())
    except UnknownTaskError as exc:
        raise Http404(str(exc)) from None
    until = forced.forced_until
    pages.log_action(request, f"force-enabled the circuit of {task_id}")
    messages.success(
        request,
        f"The circuit of {task_id} is closed and force-enabled"
        + (f" until {until:%Y-%m-%d %H:%M:%S} UTC." if until else "."),
    )
    return HttpResponseRedirect(reverse("admin:orchestrator_tasks"))


def url() -> URLPattern:
    return path(
        "tasks/<str:task_id>/force-enable/",
        pages.requires(Access.OPERATE, require_POST(force_enable_view)),
        name="orchestrator_task_force_enable",
    )
