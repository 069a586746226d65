"""Pause and resume a task or its resource class from the Tasks page (operate permission, POST
with a CSRF token): `recovery.pauses` writes the pause under the operator's name, never here."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_POST

from orchestrator.admin import pages
from orchestrator.api.access import Access
from orchestrator.api.pauses import MAX_REASON
from orchestrator.models import PauseScope
from orchestrator.recovery import pauses
from orchestrator.recovery.pauses import AlreadyPaused, NotPaused, UnknownScope
from orchestrator.text import unstorable


def pause_view(request: HttpRequest, action: str) -> HttpResponse:
    back = HttpResponseRedirect(reverse("admin:orchestrator_tasks"))
    if action not in ("pause", "resume") or request.POST.get("scope") not in PauseScope.values:
        raise Http404("no such pause action")
    scope = PauseScope(request.POST["scope"])
    name = request.POST.get("name", "")
    who = request.user.get_username()
    try:
        if action == "resume":
            resumed = pauses.resume(scope, name, by=who)
            what = f"resumed {scope} {name}: {resumed.released} held runs published again"
        else:
            reason = request.POST.get("reason", "").strip()
            if not reason or len(reason) > MAX_REASON or unstorable(reason):
                messages.error(request, f"A pause needs a reason (1 to {MAX_REASON} characters).")
                return back
            refuse = request.POST.get("refuse_starts") == "on"
            pauses.pause(scope, name, by=who, reason=reason, refuse_starts=refuse)
            what = f"paused {scope} {name}" + (" (refusing starts)" if refuse else "")
    except UnknownScope as exc:
        raise Http404(str(exc)) from None
    except (AlreadyPaused, NotPaused) as exc:
        messages.error(request, str(exc))
        return back
    pages.log_action(request, what)
    messages.success(request, what[0].upper() + what[1:] + ".")
    return back


def url() -> URLPattern:
    return path(
        "tasks/pauses/<str:action>/",
        pages.requires(Access.OPERATE, require_POST(pause_view)),
        name="orchestrator_task_pause",
    )
