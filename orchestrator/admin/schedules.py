"""The "Schedules" page: every static schedule (django-celery-beat's rows, with who owns which
field) and every row of each dynamic schedule, with its last fire, next fire and whether it
is on (`scheduler.overview`). View permission reads it; operate switches a schedule on or off
(`scheduler.switch`) and gives it a cadence of its own or resets it to its definition
(`scheduler.overrides`), each with a CSRF-protected POST to the same page that the admin log
records under the operator's name."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django_celery_beat.models import PeriodicTask

from orchestrator.admin import pages
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.clock import SYSTEM, describe
from orchestrator.models import SchedulerState
from orchestrator.scheduler import overrides, overview, switch
from orchestrator.scheduler.names import state_key


def schedules_view(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        if not access.allows(request.user, Access.OPERATE):
            raise PermissionDenied(access.refusal(Access.OPERATE))
        _post(request)
        return HttpResponseRedirect(reverse("admin:orchestrator_schedules"))
    now = SYSTEM.now()
    page = pages.context(
        request,
        "Schedules",
        static=[(s, _in(s.next_fire_at, now)) for s in overview.static_schedules(SYSTEM)],
        dynamic=[
            (d, [(row, _in(row.next_fire_at, now)) for row in d.rows])
            for d in overview.dynamic_schedules(SYSTEM)
        ],
        can_operate=access.allows(request.user, Access.OPERATE),
    )
    return TemplateResponse(request, "admin/orchestrator/schedules.html", page)


def _in(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    if moment <= now:
        return "due now"
    return "in " + describe(max(timedelta(0), moment - now))


def _post(request: HttpRequest) -> None:
    action = request.POST.get("action", "switch")
    if action == "switch":
        _switch(request)
    elif action in ("override", "reset"):
        _override(request, reset=action == "reset")
    else:
        messages.error(request, f"Nothing done: unknown action {action!r}.")


def _override(request: HttpRequest, *, reset: bool) -> None:
    """Set (`cron` and `tz`, or `every_s`) or reset an operator's cadence (`scheduler.overrides`)
    of a static schedule (`name`) or a dynamic row (`task`, `row`)."""
    actor = request.user.get_username()
    kind = request.POST.get("kind")
    name, task_id, row_key = (request.POST.get(f, "") for f in ("name", "task", "row"))
    label = f"static schedule {name}" if kind == "static" else f"{task_id} row {row_key}"
    try:
        wanted = _cadence(request)
        if kind == "static" and reset:
            done = overrides.reset_static(name, actor=actor)
        elif kind == "static":
            done = bool(overrides.set_static(name, wanted, actor=actor))
        elif kind == "dynamic" and reset:
            done = overrides.reset_dynamic(task_id, row_key, actor=actor)
        elif kind == "dynamic":
            done = bool(overrides.set_dynamic(task_id, row_key, wanted, actor=actor))
        else:
            messages.error(request, "Nothing changed: say which schedule (static or dynamic).")
            return
    except (overrides.BadOverride, overrides.CannotOverride, switch.UnknownSchedule) as exc:
        messages.error(request, f"The {label} keeps its cadence: {exc}")
        return
    if reset and not done:
        messages.info(request, f"The {label} had no override.")
        return
    what = "reset to its definition" if reset else "given the operator's cadence"
    pages.log_action(request, f"{label} {what}", PeriodicTask.objects.filter(name=name).first())
    messages.success(request, f"The {label} is {what}.")


def _seconds(request: HttpRequest, field: str) -> int | None:
    text = request.POST.get(field, "").strip()
    if text and not (text.isascii() and text.isdigit() and len(text) <= 12):
        raise overrides.BadOverride(field, f"{text!r} is not a whole number of seconds")
    return int(text) if text else None


def _cadence(request: HttpRequest) -> overrides.Cadence:
    return overrides.Cadence(
        cron=request.POST.get("cron", "").strip(),
        every_s=_seconds(request, "every_s"),
        tz=request.POST.get("tz", "").strip(),
        jitter_s=_seconds(request, "jitter_s"),
    )


def _switch(request: HttpRequest) -> None:
    """One schedule on or off: `kind` static (`name`) or dynamic (`task`, `row`), `enabled`
    "1" or "0"."""
    enabled = request.POST.get("enabled") == "1"
    kind = request.POST.get("kind")
    actor = request.user.get_username()
    word = "on" if enabled else "off"
    try:
        if kind == "static":
            name = request.POST.get("name", "")
            changed = switch.switch_static(name, enabled=enabled, actor=actor)
            label = f"static schedule {name}"
            logged: PeriodicTask | SchedulerState | None = PeriodicTask.objects.filter(
                name=name
            ).first()
        elif kind == "dynamic":
            task_id, row_key = request.POST.get("task", ""), request.POST.get("row", "")
            changed = switch.switch_dynamic(task_id, row_key, enabled=enabled, actor=actor)
            label = f"dynamic schedule {task_id} row {row_key}"
            logged = SchedulerState.objects.filter(key=state_key(task_id, row_key)).first()
        else:
            messages.error(request, "Nothing switched: say which schedule (static or dynamic).")
            return
    except (switch.UnknownSchedule, switch.CannotEnable) as exc:
        messages.error(request, str(exc))
        return
    if not changed:
        messages.info(request, f"The {label} was already {word}.")
        return
    pages.log_action(request, f"switched {label} {word}", logged)
    messages.success(request, f"The {label} is {word}.")


def url() -> URLPattern:
    return path(
        "schedules/", pages.requires(Access.VIEW, schedules_view), name="orchestrator_schedules"
    )
