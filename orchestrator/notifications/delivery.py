"""The notification loop: every LUMASTRA_NOTIFY_INTERVAL_S on the cluster leader, due
notifications are leased and sent to the targets that want their kind (`targets`).

- **Each target once.** A notification records the targets that took it; one that some target
  refused is tried again later, with exponential backoff and jitter, and only there. After
  LUMASTRA_NOTIFY_MAX_ATTEMPTS it is dead (the Notifications page lists it). A target that
  fails is not tried again in the same pass: its other messages wait for their retry instead
  of each waiting out its timeout. Its lease covers a sender that dies mid-send: past it
  another leader sends again, so a target may see a message twice, never none. A pass that
  nears its lease stops sending and lets go of what it did not send.
- **A budget per kind.** At most LUMASTRA_NOTIFY_MAX_PER_HOUR messages of one kind in any
  hour, counted from the first target that took each. A pass with more due than the budget
  allows sends one digest for the rest of the kind ("37 dead letters", the first titles, a
  link to them all); a kind with no budget left waits until its oldest message of the hour is
  an hour old. Nothing is dropped.
- **No target wants it**: it is kept as `unsent`, so the page still shows what happened.
- **The drain's poison list growing** is noticed here, by its length, rather than where an
  entry is poisoned: that is when Postgres refuses writes, this notification's among them.

Each message carries its console link (LUMASTRA_CONSOLE_URL + the row's path). Sends go one
after another: Apprise's log, which says why a send failed, is captured around each.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Q

from orchestrator.backoff import jittered_backoff
from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.locks import Fence
from orchestrator.models import Notification, NotificationKind, NotificationStatus
from orchestrator.notifications import events
from orchestrator.notifications.targets import Target
from orchestrator.stores import keys, valkey
from tasks.policies import Retry

if TYPE_CHECKING:
    import apprise

log = logging.getLogger(__name__)

BATCH = 100
# A digest takes in at most this many of its kind's due notifications.
DIGEST_MAX = 10_000
HOUR = timedelta(hours=1)
# Titles a digest lists before "and N more".
DIGEST_LISTS = 10
BACKOFF = Retry(max_attempts=1, base=timedelta(seconds=10), cap=timedelta(hours=1))
LEASE = timedelta(minutes=10)
# A pass stops sending this long before its lease runs out.
LEASE_MARGIN = timedelta(minutes=2)

_NOUNS = {
    NotificationKind.DEAD_LETTER: "dead letters",
    NotificationKind.CIRCUIT_OPEN: "circuits opened",
    NotificationKind.SCHEDULE_PAUSED: "schedules switched off",
    NotificationKind.WINDOW_HELD: "run windows closed with work held",
    NotificationKind.POISON_GROWING: "drain poison list growths",
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


@dataclass
class _Pass:
    """One pass's leases and what it learnt of the targets."""

    leased: dict[int, Notification] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    down: dict[str, str] = field(default_factory=dict)  # target key → why it failed
    deadline: float = 0.0


class Notifier:
    def __init__(self, targets: list[Target], clock: Clock = SYSTEM) -> None:
        self.targets = targets
        self.clock = clock

    def tick(self, fence: Fence | None = None) -> NotifyReport:
        """One pass; with `fence` (the cluster seat), none unless this process still leads."""
        if fence is not None:
            fence.check()
        self._note_poison_growth()
        report = NotifyReport()
        this = _Pass(deadline=time.monotonic() + (LEASE - LEASE_MARGIN).total_seconds())
        try:
            by_kind: dict[str, list[Notification]] = defaultdict(list)
            for row in self._lease(this, Q()):
                by_kind[row.kind].append(row)
            for kind, rows in by_kind.items():
                wanted = [target for target in self.targets if target.wants(kind)]
                if not wanted:
                    self._settle(this, rows, status=NotificationStatus.UNSENT)
                    report.unsent += len(rows)
                    continue
                for message in self._messages(this, kind, rows, report):
                    if time.monotonic() > this.deadline:
                        break
                    if fence is not None:
                        fence.check()
                    self._send(this, message, wanted, report)
        finally:
            # What this pass leased and did not settle is due again at once, not in LEASE.
            unsent = [row_id for row_id in this.leased if row_id not in this.settled]
            if unsent:
                Notification.objects.filter(id__in=unsent, leased_until__isnull=False).update(
                    leased_until=None
                )
        if report.sent or report.failed or report.held:
            log.info(
                "notifications: %d sent, %d failed (%d dead), %d held by their hourly budget",
                report.sent,
                report.failed,
                report.dead,
                report.held,
            )
        return report

    def _lease(self, this: _Pass, which: Q, limit: int = BATCH) -> list[Notification]:
        now = self.clock.now()
        with transaction.atomic():
            due = list(
                Notification.objects.select_for_update(skip_locked=True)
                .filter(which, status=NotificationStatus.PENDING, next_attempt_at__lte=now)
                .filter(Q(leased_until__isnull=True) | Q(leased_until__lt=now))
                .exclude(id__in=list(this.leased))
                .order_by("next_attempt_at", "id")[:limit]
            )
            Notification.objects.filter(id__in=[row.id for row in due]).update(
                leased_until=now + LEASE
            )
        for row in due:
            row.leased_until = now + LEASE
            this.leased[row.id] = row
        return due

    def _messages(
        self, this: _Pass, kind: str, rows: list[Notification], report: NotifyReport
    ) -> list[Message]:
        """The messages this pass sends for `kind`, within its hourly budget; rows past the
        budget are held until it allows one more. Rows some target already took were counted
        then: their retry (to the targets that failed) is one more message, not counted."""
        retried = [row for row in rows if row.sent_at is not None]
        fresh = [row for row in rows if row.sent_at is None]
        messages = [_message(kind, retried)] if retried else []
        if not fresh:
            return messages
        now = self.clock.now()
        sent = Notification.objects.filter(
            kind=kind, sent_at__gt=now - HOUR, in_digest=False
        ).aggregate(count=Count("id"), oldest=Min("sent_at"))
        budget = settings.CONFIG.notify_max_per_hour - sent["count"]
        if budget <= 0:
            self._settle(this, fresh, next_attempt_at=sent["oldest"] + HOUR)
            report.held += len(fresh)
            return messages
        singles = fresh if len(fresh) <= budget else fresh[: budget - 1]
        messages += [_message(kind, [row]) for row in singles]
        if rest := fresh[len(singles) :]:
            more = self._lease(this, Q(kind=kind, sent_at__isnull=True), DIGEST_MAX - len(rest))
            messages.append(_message(kind, rest + more))
        return messages

    def _send(
        self, this: _Pass, message: Message, wanted: list[Target], report: NotifyReport
    ) -> None:
        import apprise

        owed = [t for t in wanted if any(t.key not in row.sent_to for row in message.rows)]
        took, errors = [], []
        for target in owed:
            if target.key in this.down:
                errors.append(f"{target.shown()}: not tried, it failed earlier in this pass")
                continue
            with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:  # type: ignore[no-untyped-call]
                sender = apprise.Apprise()
                sender.add(target.url)
                ok = sender.notify(
                    title=message.title,
                    body=message.body,
                    notify_type=_notify_type(message.rows[0].kind),
                )
            if ok:
                took.append(target.key)
            else:
                reason = " ".join(captured.getvalue().split()) or "Apprise refused the send"
                this.down[target.key] = reason
                errors.append(f"{target.shown()}: {reason}")
        now = self.clock.now()
        for index, row in enumerate(message.rows):
            sent_to = sorted(set(row.sent_to) | set(took))
            # The budget counts a message from the first target that took it.
            sent_at = row.sent_at or (now if took else None)
            # Counted against the budget as sent the first time: a digest's lead only.
            in_digest = row.in_digest if row.sent_at else index > 0
            if not errors:
                self._settle(
                    this,
                    [row],
                    status=NotificationStatus.SENT,
                    sent_at=sent_at,
                    sent_to=sent_to,
                    in_digest=in_digest,
                    attempts=row.attempts + 1,
                )
                continue
            attempts = row.attempts + 1
            dead = attempts >= settings.CONFIG.notify_max_attempts
            self._settle(
                this,
                [row],
                status=NotificationStatus.DEAD if dead else NotificationStatus.PENDING,
                sent_at=sent_at,
                sent_to=sent_to,
                in_digest=in_digest,
                attempts=attempts,
                next_attempt_at=now + jittered_backoff(BACKOFF, attempts),
                last_error="; ".join(errors)[:2000],
            )
            report.dead += dead
        if errors:
            report.failed += len(message.rows)
            log.warning("notification %r failed: %s", message.title, "; ".join(errors))
        else:
            report.sent += len(message.rows)

    def _settle(self, this: _Pass, rows: list[Notification], **fields: object) -> None:
        """Write `fields` on `rows` and let their lease go; only under this pass's lease, so a
        sender that outlived it (a failover) records nothing."""
        for row in rows:
            Notification.objects.filter(id=row.id, leased_until=row.leased_until).update(
                leased_until=None, **fields
            )
            this.settled.add(row.id)

    def _note_poison_growth(self) -> None:
        """One notification each time the drain's poison list grew since the last pass; one
        round trip when it did not."""
        pipe = valkey.client().pipeline(transaction=False)
        pipe.llen(keys.drain_poison())
        pipe.get(keys.poison_noticed())
        length, noticed = valkey.execute(pipe)
        before = int(noticed or 0)
        if length > before:
            events.notify(
                NotificationKind.POISON_GROWING,
                subject=str(length),
                title=f"Drain poison list grew to {length} (+{length - before})",
                body=(
                    "Writes Postgres kept refusing were set aside for an operator: replay or "
                    "discard them on the Dead letters page."
                ),
                link="/admin/orchestrator/taskhistory/dead-letters/",
            )
        if length != before:
            valkey.client().set(keys.poison_noticed(), length)


def _with_link(body: str, link: str) -> str:
    return f"{body}\n\n{settings.CONFIG.console_url}{link}" if link else body


def _message(kind: str, rows: list[Notification]) -> Message:
    """One notification as itself, or several as one digest."""
    if len(rows) == 1:
        (row,) = rows
        return Message(rows, row.title, _with_link(row.body or row.title, row.link))
    listed = [f"- {row.title}" for row in rows[:DIGEST_LISTS]]
    if len(rows) > DIGEST_LISTS:
        listed.append(f"… and {len(rows) - DIGEST_LISTS} more")
    noun = _NOUNS.get(kind, f"{kind} notifications")  # type: ignore[call-overload]
    link = f"/admin/orchestrator/notification/?kind__exact={kind}"
    return Message(rows, f"{len(rows)} {noun}", _with_link("\n".join(listed), link))


def _notify_type(kind: str) -> apprise.NotifyType:
    import apprise

    if kind in (NotificationKind.DEAD_LETTER, NotificationKind.WATCHER_DOWN):
        return apprise.NotifyType.FAILURE
    if kind == NotificationKind.TEST:
        return apprise.NotifyType.INFO
    return apprise.NotifyType.WARNING
