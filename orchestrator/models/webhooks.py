"""The webhook endpoints run events go to, the events' outbox and each delivery
(`orchestrator/webhooks/`)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class WebhookEndpoint(models.Model):
    """Where run events are delivered, signed with `secret` (kept: it signs every delivery)."""

    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100)
    description = models.CharField(max_length=200, blank=True, default="")
    # Event states to deliver (pending, active, cancelling, completed, failed, cancelled);
    # empty: all. Task ids to deliver for; empty: all.
    states = models.JSONField(default=list, blank=True)
    tasks = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "webhook_endpoint"
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        return self.url

    def wants(self, state: str, task_id: str) -> bool:
        return (not self.states or state in self.states) and (
            not self.tasks or task_id in self.tasks
        )


class RunEventOutbox(models.Model):
    """A run's change of state as a CloudEvent, written by a trigger on task_history in the
    change's own transaction (only while some endpoint is enabled); fanned out into
    deliveries by the webhook loop, then deleted."""

    id = models.CharField(primary_key=True, max_length=40)  # the CloudEvent id
    envelope = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "run_event_outbox"
        verbose_name = "run event"

    def __str__(self) -> str:
        return f"{self.envelope.get('type')} {self.envelope.get('subject')}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # to be sent when due
    DELIVERED = "delivered"  # the endpoint answered 2xx
    DEAD = "dead"  # failed LUMASTRA_WEBHOOK_MAX_ATTEMPTS times; redeliver from the admin


class WebhookDelivery(models.Model):
    """One event to one endpoint: its attempts, kept as the endpoint's delivery history."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.CharField(max_length=40)
    event_type = models.CharField(max_length=80)
    run_id = models.CharField(max_length=40)
    envelope = models.JSONField()
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    # A sender holds it until then; past it, another may take it (its sender died).
    leased_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "webhook_delivery"
        verbose_name = "webhook delivery"
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(
                "next_attempt_at",
                name="webhook_delivery_due",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["endpoint", "-created_at"], name="webhook_delivery_history"),
            # The dead letters, newest first (the dead-letters page), without the delivered.
            models.Index(
                fields=["-created_at"],
                name="webhook_delivery_dead",
                condition=Q(status="dead"),
            ),
        ]
        constraints = [
            models.UniqueConstraint("endpoint", "event_id", name="webhook_delivery_once"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.run_id} → {self.endpoint_id}"
