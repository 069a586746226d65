"""The coverage outbox's dead letters on the admin's Dead letters page, plugged in through
`settings.LUMASTRA_DEAD_LETTER_SOURCES` (the engine never imports coverage).

`outbox_section(limit)`: the catalog events the dispatcher gave up on after
LUMASTRA_COVERAGE_DISPATCH_MAX_ATTEMPTS (`dead_at` set), newest first, with their count.
`redeliver_view`: the section's action (operate permission, CSRF-protected POST, served under
the outbox's admin URLs): the chosen events go back to the queue through
`dispatcher.redeliver`, and the admin log records who did it.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from coverage import dispatcher
from coverage.models import EventOutbox
from orchestrator.admin import dead_letters, pages
from orchestrator.text import is_ascii_digits

_ERROR_SHOWN = 200


def outbox_section(limit: int) -> dead_letters.Section:
    # Handled events leave the outbox, so the dead letters are read from a small table.
    dead = EventOutbox.objects.filter(dead_at__isnull=False)
    rows = list(
        dead.order_by("-dead_at").values_list(
            "id", "kind", "item_id", "attempts", "dead_at", "last_error"
        )[:limit]
    )
    return dead_letters.Section(
        key="dead-outbox-events",
        title="Catalog events that dead-lettered (coverage outbox)",
        description="Catalog changes the dispatcher failed to turn into coverage rows after "
        "every attempt. Redeliver puts them back in the queue, due now, attempts from zero.",
        count=dead.count(),
        columns=("event", "kind", "item", "attempts", "dead since (UTC)", "last error"),
        rows=tuple(
            dead_letters.Row(
                id=str(event_id),
                cells=(
                    str(event_id),
                    kind,
                    str(item_id),
                    str(attempts),
                    f"{dead_at:%Y-%m-%d %H:%M:%S}",
                    last_error[:_ERROR_SHOWN],
                ),
                link=reverse("admin:coverage_eventoutbox_change", args=[event_id]),
            )
            for event_id, kind, item_id, attempts, dead_at, last_error in rows
        ),
        actions=(
            dead_letters.Action(
                "redeliver", "Redeliver", reverse("admin:coverage_outbox_redeliver")
            ),
        ),
        full_list_url=reverse("admin:coverage_eventoutbox_changelist") + "?dead_at__isempty=0",
    )


def redeliver_view(request: HttpRequest) -> HttpResponse:
    action, ids = dead_letters.posted(request)
    if action != "redeliver":
        messages.error(request, "Nothing done: no action was chosen.")
    else:
        count = dispatcher.redeliver([int(i) for i in ids if is_ascii_digits(i)])
        pages.log_action(request, f"redelivered {count} outbox events")
        messages.success(request, f"{count} dead-lettered events redelivered")
    return HttpResponseRedirect(reverse("admin:orchestrator_dead_letters"))
