"""One notification written where its event happens, in the caller's transaction when it has
one: the event and its notification stand or fall together. Sending is the leader's
(`notifications.delivery`); writing costs one INSERT, on events that are rare by nature
(a circuit opening, a schedule switched off, an entry poisoned)."""

from __future__ import annotations

from orchestrator.models import Notification, NotificationKind

TITLE_MAX = 200
BODY_MAX = 1000


def notify(
    kind: NotificationKind, *, subject: str, title: str, body: str = "", link: str = ""
) -> Notification:
    """Record a notification of `kind` about `subject`; `link` is a console path."""
    return Notification.objects.create(
        kind=kind, subject=subject[:200], title=title[:TITLE_MAX], body=body[:BODY_MAX], link=link
    )


def send_test(actor: str) -> Notification:
    """An operator's test: it goes to every target that wants `test` (all, unless limited)."""
    return notify(
        NotificationKind.TEST,
        subject=actor,
        title="Lumastra test notification",
        body=f"Sent at {actor}'s request: notifications reach you.",
        link="/admin/orchestrator/notification/",
    )
