"""The "Dead letters" page: everything that stopped being retried and waits for an operator,
in one place, a section per kind with its count and its newest rows.

- Runs that exhausted their retries (failed, `error.exhausted`): requeue as a new run
  (`runs.rerun`, priority 1, linked to the original); the full list is the runs list's
  "outcome: dead letters" filter.
- The pending-write drain's poison list (terminal writes Postgres kept refusing): replay (the
  entry goes back on the drain, attempts from zero) or discard (`recovery.drain_poison`).
- Webhook deliveries that failed every attempt: redeliver (`webhooks.delivery.redeliver`).
- The sections of the apps above the engine, named in `settings.LUMASTRA_DEAD_LETTER_SOURCES`
  (the coverage outbox): each source is a dotted path to `source(limit) -> Section`, whose
  actions post to the app's own URL, which reads the posted rows with `posted()`. The engine
  never imports them.

View permission reads the page; the actions are CSRF-protected POSTs that need operate, are
carried out by the orchestrator functions above (never here) and land in the admin log under
the operator's name. A section shows its newest SHOWN rows; a source that raises is shown
with its error, the other sections still render.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.module_loading import import_string

from orchestrator.admin import pages
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.hooks.base import Refused
from orchestrator.models import DeliveryStatus, TaskHistory
from orchestrator.recovery import drain_poison as poison_list
from orchestrator.runs import drain
from orchestrator.runs.cancel import UnknownRun
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.rerun import dead_letters as exhausted
from orchestrator.runs.rerun import requeued_as, rerun
from orchestrator.text import is_ascii_digits
from orchestrator.webhooks.delivery import dead as dead_deliveries
from orchestrator.webhooks.delivery import redeliver

log = logging.getLogger(__name__)

SHOWN = 50
_MESSAGE_SHOWN = 200


@dataclass(frozen=True)
class Action:
    name: str  # what the POST says it wants ("redeliver")
    label: str  # the button's text
    url: str  # where the section's form posts


@dataclass(frozen=True)
class Row:
    id: str  # posted back to the action
    cells: tuple[str, ...]  # one per column of the section
    link: str = ""  # the row's own page, on its first cell
    # The actions this row offers, by name; empty: all of the section's.
    actions: tuple[str, ...] = ()
    note: str = ""  # a line under the row's cells (e.g. "requeued as run_…")


@dataclass(frozen=True)
class Section:
    """One kind of dead letter, as a source gives it to the page."""

    key: str  # the section's HTML id
    title: str
    description: str
    count: int  # all of them, not just the rows shown
    columns: tuple[str, ...]
    rows: tuple[Row, ...]
    actions: tuple[Action, ...]
    full_list_url: str = ""
    error: str = ""  # the source failed: shown instead of the rows


Source = Callable[[int], Section]


def posted(request: HttpRequest) -> tuple[str, list[str]]:
    """(action, row ids) of a section's form: a row's own button posts `row=<action>:<id>`,
    a bulk button `bulk=<action>` with the ticked rows as `selected`."""
    one = request.POST.get("row", "")
    if ":" in one:
        action, row_id = one.split(":", 1)
        return action, [row_id]
    return request.POST.get("bulk", ""), request.POST.getlist("selected")[:SHOWN]


# --- the engine's sections ----------------------------------------------------------------


def exhausted_runs(limit: int) -> Section:
    dead = exhausted()
    rows = list(
        dead.order_by("-created_at").values_list(
            "id", "task_id", "finished_at", "attempts", "error"
        )[:limit]
    )
    requeued = requeued_as(r[0] for r in rows) if rows else {}
    url = reverse("admin:orchestrator_dead_letters")
    return Section(
        key="exhausted-runs",
        title="Runs that exhausted their retries",
        description="Failed after their last attempt. Requeue starts a new run of the same "
        "input at priority 1, linked to the original (a pipeline resumes at its failed stage).",
        count=dead.count(),
        columns=("run", "task", "finished (UTC)", "attempts", "error kind", "message"),
        rows=tuple(
            Row(
                id=run_id,
                cells=(
                    run_id,
                    task_id,
                    f"{finished:%Y-%m-%d %H:%M:%S}" if finished else "-",
                    str(attempts),
                    str((error or {}).get("kind", "-")),
                    str((error or {}).get("message", ""))[:_MESSAGE_SHOWN],
                ),
                link=reverse("admin:orchestrator_taskhistory_change", args=[run_id]),
                note=("requeued as " + ", ".join(requeued[run_id])) if run_id in requeued else "",
            )
            for run_id, task_id, finished, attempts, error in rows
        ),
        actions=(Action("requeue", "Requeue as new run", url),),
        full_list_url=reverse("admin:orchestrator_taskhistory_changelist") + "?outcome=dead-letter",
    )


def drain_poison(limit: int) -> Section:
    entries = poison_list.poisoned(limit)
    _, count = drain.depth()
    states = dict(
        TaskHistory.objects.filter(id__in=[e.run_id for e in entries if e.run_id]).values_list(
            "id", "state"
        )
    )
    url = reverse("admin:orchestrator_dead_letters")
    return Section(
        key="drain-poison",
        title="Drain poison list",
        description="Terminal writes Postgres kept refusing: these runs' ends were never "
        "recorded as the handler produced them (the reconciler fails such a run as an orphan). "
        "Replay puts the write back on the drain once the cause is fixed; a run that ended "
        "otherwise meanwhile drops it. Discard forgets it (it is logged first).",
        count=count,
        columns=("run", "write", "attempts", "error", "poisoned at", "run now"),
        rows=tuple(
            Row(
                id=e.record_id,
                cells=(
                    e.run_id or "(unreadable entry)",
                    e.target,
                    str(e.attempts),
                    e.error[:_MESSAGE_SHOWN],
                    e.poisoned_at,
                    states.get(e.run_id, "-"),
                ),
                link=reverse("admin:orchestrator_taskhistory_change", args=[e.run_id])
                if e.run_id in states
                else "",
                actions=("replay", "discard") if e.replayable else ("discard",),
            )
            for e in entries
        ),
        actions=(Action("replay", "Replay", url), Action("discard", "Discard", url)),
    )


def dead_webhooks(limit: int) -> Section:
    # One partial index (webhook_delivery_dead) serves the count and the newest rows.
    dead = dead_deliveries()
    rows = list(dead.select_related("endpoint").order_by("-created_at")[:limit])
    return Section(
        key="dead-webhooks",
        title="Webhook deliveries that dead-lettered",
        description="Failed every attempt. Redeliver sends them again now, attempts from zero.",
        count=dead.count(),
        columns=("delivery", "endpoint", "event", "run", "attempts", "last status", "last error"),
        rows=tuple(
            Row(
                id=str(d.pk),
                cells=(
                    str(d.pk),
                    d.endpoint.url,
                    d.event_type,
                    d.run_id,
                    str(d.attempts),
                    str(d.last_status_code or "-"),
                    d.last_error[:_MESSAGE_SHOWN],
                ),
                link=reverse("admin:orchestrator_webhookdelivery_change", args=[d.pk]),
            )
            for d in rows
        ),
        actions=(Action("redeliver", "Redeliver", reverse("admin:orchestrator_dead_letters")),),
        full_list_url=reverse("admin:orchestrator_webhookdelivery_changelist")
        + f"?status__exact={DeliveryStatus.DEAD.value}",
    )


ENGINE_SOURCES: tuple[Source, ...] = (exhausted_runs, drain_poison, dead_webhooks)


def sections(limit: int = SHOWN) -> list[Section]:
    """The engine's sections, then those of `settings.LUMASTRA_DEAD_LETTER_SOURCES`."""
    named: list[tuple[str, Source | str]] = [(s.__name__, s) for s in ENGINE_SOURCES]
    named += [(dotted, dotted) for dotted in settings.LUMASTRA_DEAD_LETTER_SOURCES]
    found = []
    for name, source in named:
        try:
            provide: Source = import_string(source) if isinstance(source, str) else source
            found.append(provide(limit))
        except Exception as exc:
            log.exception("dead letters: source %s failed; the other sections still render", name)
            found.append(_failed(name, exc))
    return found


def _failed(name: str, exc: Exception) -> Section:
    return Section(
        key=name.replace(".", "-"),
        title=name,
        description="",
        count=0,
        columns=(),
        rows=(),
        actions=(),
        error=f"{type(exc).__name__}: {exc}",
    )


# --- the page -----------------------------------------------------------------------------


def dead_letters_view(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        if not access.allows(request.user, Access.OPERATE):
            raise PermissionDenied(access.refusal(Access.OPERATE))
        action, ids = posted(request)
        _ACTIONS.get(action, _unknown)(request, ids)
        return HttpResponseRedirect(reverse("admin:orchestrator_dead_letters"))
    found = sections()
    page = pages.context(
        request,
        "Dead letters",
        sections=found,
        total=sum(s.count for s in found),
        can_operate=access.allows(request.user, Access.OPERATE),
    )
    return TemplateResponse(request, "admin/orchestrator/dead_letters.html", page)


def _requeue(request: HttpRequest, run_ids: list[str]) -> None:
    for run_id in run_ids:
        try:
            handle = rerun(run_id, actor=request.user.get_username())
        except (StartRefused, Refused, UnknownRun) as exc:
            messages.warning(request, f"Run {run_id}: {exc}")
            continue
        pages.log_action(request, f"requeued dead letter {run_id} as run {handle.run_id}")
        messages.success(request, f"Run {run_id}: requeued as {handle.run_id}")


def _replay(request: HttpRequest, record_ids: list[str]) -> None:
    for record_id in record_ids:
        try:
            entry = poison_list.replay_poisoned(record_id)
        except (poison_list.PoisonGone, poison_list.NotReplayable, poison_list.DrainFull) as exc:
            messages.warning(request, str(exc))
            continue
        pages.log_action(
            request, f"replayed the poisoned {entry.target} write of run {entry.run_id}"
        )
        messages.success(request, f"Run {entry.run_id}: its {entry.target} write is on the drain")


def _discard(request: HttpRequest, record_ids: list[str]) -> None:
    for record_id in record_ids:
        try:
            entry = poison_list.discard_poisoned(record_id)
        except poison_list.PoisonGone as exc:
            messages.warning(request, str(exc))
            continue
        what = f"the {entry.target} write of run {entry.run_id}" if entry.run_id else "an entry"
        pages.log_action(request, f"discarded {what} from the drain poison list")
        messages.success(request, f"Discarded {what}.")


def _redeliver_webhooks(request: HttpRequest, delivery_ids: list[str]) -> None:
    count = redeliver([int(i) for i in delivery_ids if is_ascii_digits(i)])
    pages.log_action(request, f"redelivered {count} webhook deliveries")
    messages.success(request, f"{count} webhook deliveries to be sent again")


def _unknown(request: HttpRequest, ids: list[str]) -> None:
    messages.error(request, "Nothing done: no action was chosen.")


_ACTIONS: dict[str, Callable[[HttpRequest, list[str]], None]] = {
    "requeue": _requeue,
    "replay": _replay,
    "discard": _discard,
    "redeliver": _redeliver_webhooks,
}


def url() -> URLPattern:
    return path(
        "dead-letters/",
        pages.requires(Access.VIEW, dead_letters_view),
        name="orchestrator_dead_letters",
    )
