"""Notifications an operator receives (`orchestrator/notifications/`): one row per event,
written where the event happens, sent by the leader's `notifications` loop."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class NotificationKind(models.TextChoices):
    DEAD_LETTER = "dead_letter"  # a run exhausted its retries
    CIRCUIT_OPEN = "circuit_open"  # a task's circuit opened
    SCHEDULE_PAUSED = "schedule_paused"  # a schedule switched off by its failures
    WINDOW_HELD = "window_held"  # a run window closed with runs still held by it
    POISON_GROWING = "poison_growing"  # the drain poisoned an entry
    WATCHER_DOWN = "watcher_down"  # a worker host's file watcher died
    TEST = "test"  # an operator's "send test notification"


class NotificationStatus(models.TextChoices):
    PENDING = "pending"  # to be sent when due
    SENT = "sent"  # every target that wants its kind took it
    DEAD = "dead"  # failed LUMASTRA_NOTIFY_MAX_ATTEMPTS times
    UNSENT = "unsent"  # no target wants its kind (or none is configured)


class Notification(models.Model):
    kind = models.CharField(max_length=32, choices=NotificationKind.choices)
    # What it is about (a run id, a task id, a schedule's name), for its link and the digest.
    subject = models.CharField(max_length=200, blank=True, default="")
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True, default="")
    # The console page it is about, a path below LUMASTRA_CONSOLE_URL.
    link = models.CharField(max_length=300, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=NotificationStatus.choices, db_default=NotificationStatus.PENDING
    )
    attempts = models.PositiveIntegerField(db_default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    # A sender holds it until then; past it, another may take it (its sender died).
    leased_until = models.DateTimeField(null=True, blank=True)
    # The targets (`notifications.targets.Target.key`) that took it: a retry sends to the rest.
    sent_to = models.JSONField(db_default=models.Value([], models.JSONField()), blank=True)
    # Sent inside another row's digest message (its kind was over its hourly budget), so not
    # counted against the budget; the digest's own row is.
    in_digest = models.BooleanField(db_default=False)
    last_error = models.TextField(blank=True, db_default="")
    created_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "notification_outbox"
        verbose_name = "notification"
        indexes = [
            models.Index("next_attempt_at", name="notification_due", condition=Q(status="pending")),
            # The hourly budget of a kind: what it sent in the last hour.
            models.Index(
                fields=["kind", "-sent_at"],
                name="notification_sent",
                condition=Q(sent_at__isnull=False, in_digest=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.title}"
