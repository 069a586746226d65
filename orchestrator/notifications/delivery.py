"""The notification loop: every LUMASTRA_NOTIFY_INTERVAL_S on the cluster leader, due
notifications are leased and sent to the targets that want their kind (`targets`).

- **Each target once.** A notification records the targets that took it; one that some target
  refused is tried again later, with exponential backoff and jitter, and only there. After
  LUMASTRA_NOTIFY_MAX_ATTEMPTS it is dead (the Notifications page lists it). Its lease covers a
  sender that dies mid-send: past it another leader sends again, so a target may see a
  message twice, never none.
- **A budget per kind.** At most LUMASTRA_NOTIFY_MAX_PER_HOUR messages of one kind in any
  hour. A pass with more due than the budget allows sends one digest for the rest ("37 dead
  letters", the first titles, a link to them all); a kind with no budget left waits until
  its oldest message of the hour is an hour old. Nothing is dropped.
- **No target wants it**: it is kept as `unsent`, so the page still shows what happened.

Each message carries its console link (LUMASTRA_CONSOLE_URL + the row's path). Sends go one
after another: Apprise's log, which says why a send failed, is captured around each.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Q

from orchestrator.backoff import jittered_backoff
from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.locks import Fence
from orchestrator.models import Notification, NotificationKind, NotificationStatus
from orchestrator.notifications.targets import Target
from tasks.policies import Retry

if TYPE_CHECKING:
    import apprise

log = logging.getLogger(__name__)

BATCH = 100
HOUR = timedelta(hours=1)
# Titles a digest lists before "and N more".
DIGEST_LISTS = 10
BACKOFF = Retry(max_attempts=1, base=timedelta(seconds=10), cap=timedelta(hours=1))
# Long enough for every send of a batch to time out (Apprise's default connect and read
# timeouts are 4 s each), with a margin.
LEASE = timedelta(minutes=10)

_NOUNS = {
    NotificationKind.DEAD_LETTER: "dead letters",
    NotificationKind.CIRCUIT_OPEN: "circuits opened",
    NotificationKind.SCHEDULE_PAUSED: "schedules switched off",
    NotificationKind.WINDOW_HELD: "run windows closed with work held",
    NotificationKind.POISON_GROWING: "drain entries poisoned",
    NotificationKind.WATCHER_DOWN: "file watchers down",
    NotificationKind.TEST: "test notifications",
}


@dataclass
class NotifyReport:
    sent: int = 0
    failed: int = 0
    dead: int = 0
    unsent: int = 0
    held: int = 0


@dataclass(frozen=True)
class Message:
    """What one send says: one notification, or a digest of several of one kind."""

    rows: list[Notification]
    title: str
    body: str


class Notifier:
    def __init__(self, targets: list[Target], clock: Clock = SYSTEM) -> None:
        self.targets = targets
        self.clock = clock

    def tick(self, fence: Fence | None = None) -> NotifyReport:
        """One pass; with `fence` (the cluster seat), none unless this process still leads."""
        if fence is not None:
            fence.check()
        report = NotifyReport()
        due = self._lease()
        by_kind: dict[str, list[Notification]] = defaultdict(list)
        for row in due:
            by_kind[row.kind].append(row)
        for kind, rows in by_kind.items():
            wanted = [target for target in self.targets if target.wants(kind)]
            if not wanted:
                self._settle(rows, status=NotificationStatus.UNSENT)
                report.unsent += len(rows)
                continue
            for message in self._messages(kind, rows, report):
                if fence is not None:
                    fence.check()
                self._send(message, wanted, report)
        if report.sent or report.failed or report.held:
            log.info(
                "notifications: %d sent, %d failed (%d dead), %d held by their hourly budget",
                report.sent,
                report.failed,
                report.dead,
                report.held,
            )
        return report

    def _lease(self) -> list[Notification]:
        now = self.clock.now()
        with transaction.atomic():
            due = list(
                Notification.objects.select_for_update(skip_locked=True)
                .filter(status=NotificationStatus.PENDING, next_attempt_at__lte=now)
                .filter(Q(leased_until__isnull=True) | Q(leased_until__lt=now))
                .order_by("next_attempt_at", "id")[:BATCH]
            )
            Notification.objects.filter(id__in=[row.id for row in due]).update(
                leased_until=now + LEASE
            )
        for row in due:
            row.leased_until = now + LEASE
        return due

    def _messages(self, kind: str, rows: list[Notification], report: NotifyReport) -> list[Message]:
        """The messages this pass sends for `kind`, within its hourly budget; rows past the
        budget are held until it allows one more."""
        now = self.clock.now()
        sent = Notification.objects.filter(
            kind=kind, sent_at__gt=now - HOUR, in_digest=False
        ).aggregate(count=Count("id"), oldest=Min("sent_at"))
        budget = settings.CONFIG.notify_max_per_hour - sent["count"]
        if budget <= 0:
            self._settle(rows, next_attempt_at=sent["oldest"] + HOUR)
            report.held += len(rows)
            return []
        singles = rows if len(rows) <= budget else rows[: budget - 1]
        messages = [
            Message([row], row.title, _with_link(row.body or row.title, row.link))
            for row in singles
        ]
        if rest := rows[len(singles) :]:
            messages.append(_digest(kind, rest))
        return messages

    def _send(self, message: Message, wanted: list[Target], report: NotifyReport) -> None:
        import apprise

        owed = [t for t in wanted if any(t.key not in row.sent_to for row in message.rows)]
        took, errors = [], []
        for target in owed:
            with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:  # type: ignore[no-untyped-call]
                sender = apprise.Apprise()
                sender.add(target.url)
                ok = sender.notify(
                    title=message.title,
                    body=message.body,
                    notify_type=_notify_type(NotificationKind(message.rows[0].kind)),
                )
            if ok:
                took.append(target.key)
            else:
                reason = " ".join(captured.getvalue().split()) or "Apprise refused the send"
                errors.append(f"{target.shown()}: {reason}")
        now = self.clock.now()
        for index, row in enumerate(message.rows):
            row.sent_to = sorted(set(row.sent_to) | set(took))
            if not errors:
                self._settle(
                    [row],
                    status=NotificationStatus.SENT,
                    sent_at=now,
                    sent_to=row.sent_to,
                    in_digest=index > 0,
                    attempts=row.attempts + 1,
                )
                continue
            attempts = row.attempts + 1
            dead = attempts >= settings.CONFIG.notify_max_attempts
            self._settle(
                [row],
                status=NotificationStatus.DEAD if dead else NotificationStatus.PENDING,
                sent_to=row.sent_to,
                attempts=attempts,
                next_attempt_at=now + jittered_backoff(BACKOFF, attempts),
                last_error="; ".join(errors)[:2000],
            )
            report.dead += dead
        if errors:
            report.failed += len(message.rows)
            log.warning("notification %s failed: %s", message.title, "; ".join(errors))
        else:
            report.sent += len(message.rows)

    def _settle(self, rows: list[Notification], **fields: object) -> None:
        """Write `fields` on `rows` and let their lease go; only under this pass's lease, so a
        sender that outlived it (a failover) records nothing."""
        for row in rows:
            Notification.objects.filter(id=row.id, leased_until=row.leased_until).update(
                leased_until=None, **fields
            )


def _with_link(body: str, link: str) -> str:
    return f"{body}\n\n{settings.CONFIG.console_url}{link}" if link else body


def _digest(kind: str, rows: list[Notification]) -> Message:
    listed = [f"- {row.title}" for row in rows[:DIGEST_LISTS]]
    if len(rows) > DIGEST_LISTS:
        listed.append(f"… and {len(rows) - DIGEST_LISTS} more")
    noun = _NOUNS.get(NotificationKind(kind), kind)
    link = f"/admin/orchestrator/notification/?kind__exact={kind}"
    return Message(rows, f"{len(rows)} {noun}", _with_link("\n".join(listed), link))


def _notify_type(kind: NotificationKind) -> apprise.NotifyType:
    import apprise

    if kind in (NotificationKind.DEAD_LETTER, NotificationKind.WATCHER_DOWN):
        return apprise.NotifyType.FAILURE
    if kind == NotificationKind.TEST:
        return apprise.NotifyType.INFO
    return apprise.NotifyType.WARNING
