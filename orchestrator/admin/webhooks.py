"""Webhook endpoints (add one: its secret is shown once, on the next page) and the delivery
history, with the dead letters and their redeliver action. View to read, operate to act."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from orchestrator.admin import pages
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.models import WebhookDelivery, WebhookEndpoint
from orchestrator.webhooks.delivery import (
    InvalidEndpoint,
    check_endpoint,
    create_endpoint,
    redeliver,
)


class EndpointForm(ModelForm[WebhookEndpoint]):
    """The same checks as the API's (`webhooks.delivery.check_endpoint`), on add and change."""

    class Meta:
        model = WebhookEndpoint
        fields = ("url", "states", "tasks", "description", "enabled")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        try:
            check_endpoint(cleaned.get("url"), cleaned.get("states"), cleaned.get("tasks"))
        except InvalidEndpoint as exc:
            raise ValidationError(str(exc)) from None
        return cleaned


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(pages.ReadOnlyOperated, admin.ModelAdmin[WebhookEndpoint]):
    list_display = ("id", "url", "states", "tasks", "enabled", "description", "created_at")
    list_editable = ("enabled",)
    form = EndpointForm

    def has_add_permission(self, request: HttpRequest) -> bool:
        return access.allows(request.user, Access.OPERATE)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return access.allows(request.user, Access.OPERATE)

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return access.allows(request.user, Access.OPERATE)

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: ModelForm[Any], change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # The form checked it already (EndpointForm).
        made, secret = create_endpoint(
            obj.url, states=list(obj.states), tasks=list(obj.tasks), description=obj.description
        )
        obj.pk = made.pk
        pages.log_action(request, f"added webhook endpoint {made.url}", made)
        self.message_user(
            request,
            f"Signing secret of {made.url} (shown once; keep it for the receiver): {secret}",
            messages.WARNING,
        )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(pages.ReadOnlyOperated, admin.ModelAdmin[WebhookDelivery]):
    list_display = (
        "id",
        "endpoint",
        "event_type",
        "run_id",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "delivered_at",
    )
    list_filter = ("status", "endpoint")
    search_fields = ("run_id", "event_id")
    readonly_fields = ("last_error", "envelope")
    show_full_result_count = False
    actions = ["redeliver_deliveries"]

    @admin.action(description="Redeliver selected deliveries now", permissions=["operate"])
    def redeliver_deliveries(
        self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]
    ) -> None:
        count = redeliver(list(queryset.values_list("id", flat=True)))
        pages.log_action(request, f"redelivered {count} webhook deliveries")
        self.message_user(request, f"{count} deliveries to be sent again")
