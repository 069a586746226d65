"""Notifications (view): every event an operator was, or would have been, told of, its sends
and why one failed; "Send test notification" (operate) records a `test` one for the loop to
send to every target that wants it."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_POST

from orchestrator.admin import pages
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.models import Notification
from orchestrator.notifications import events


@admin.register(Notification)
class NotificationAdmin(pages.ReadOnlyOperated, admin.ModelAdmin[Notification]):
    list_display = ("id", "kind", "title", "status", "attempts", "created_at", "sent_at")
    list_filter = ("kind", "status")
    search_fields = ("subject", "title")
    readonly_fields = ("body", "link", "sent_to", "last_error")
    show_full_result_count = False
    change_list_template = "admin/orchestrator/notification/change_list.html"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        can_test = access.allows(request.user, Access.OPERATE)
        return super().changelist_view(request, {**(extra_context or {}), "can_test": can_test})

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "test/",
                pages.requires(Access.OPERATE, require_POST(self.test_view)),
                name="orchestrator_notification_test",
            ),
            *super().get_urls(),
        ]

    def test_view(self, request: HttpRequest) -> HttpResponse:
        actor = request.user.get_username()
        sent = events.send_test(actor)
        pages.log_action(request, f"sent test notification {sent.id}", sent)
        messages.success(
            request,
            f"Test notification {sent.id} recorded: the leader sends it to LUMASTRA_NOTIFY_URLS "
            "within LUMASTRA_NOTIFY_INTERVAL_S; its row below says whether each target took it.",
        )
        return HttpResponseRedirect(reverse("admin:orchestrator_notification_changelist"))
