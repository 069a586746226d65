"""Admin for the EPG sources (the demo's dynamic schedule rows), the media catalog and its
per-item coverage: the rows, the backlog page (heal), rescans and the outbox's dead letters."""

from __future__ import annotations

from datetime import timedelta

import django_stubs_ext
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from coverage import backlog, dispatcher
from coverage.models import (
    CoverageStatus,
    EpgSource,
    EventOutbox,
    ExternalId,
    MediaFile,
    MediaFileItem,
    MediaItem,
    MediaItemStageState,
)
from orchestrator.admin import pages
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.clock import describe
from orchestrator.hooks.base import Refused
from orchestrator.triggers import TriggerKind

# ModelAdmin[Model] is for the type checker; this makes it valid at run time too.
django_stubs_ext.monkeypatch()


@admin.register(EpgSource)
class EpgSourceAdmin(admin.ModelAdmin[EpgSource]):
    list_display = ("slug", "name", "url", "interval_minutes", "enabled", "last_refreshed_at")
    list_editable = ("interval_minutes", "enabled")
    list_filter = ("enabled",)
    search_fields = ("slug", "name", "url")
    readonly_fields = ("last_refreshed_at",)
    prepopulated_fields = {"slug": ("name",)}


# The catalog can hold a million items: no full counts, and foreign keys as raw ids (a select
# of every item would be enormous).


@admin.register(MediaItem)
class MediaItemAdmin(admin.ModelAdmin[MediaItem]):
    list_display = ("id", "kind", "title", "year", "index_number", "library", "parent")
    list_filter = ("kind", "library")
    search_fields = ("title",)
    raw_id_fields = ("parent",)
    show_full_result_count = False
    list_select_related = ("parent",)


@admin.register(MediaFile)
class MediaFileAdmin(admin.ModelAdmin[MediaFile]):
    list_display = ("id", "path", "size", "is_missing", "probed_at", "content_hash")
    list_filter = ("is_missing",)
    search_fields = ("path",)
    show_full_result_count = False


@admin.register(MediaFileItem)
class MediaFileItemAdmin(admin.ModelAdmin[MediaFileItem]):
    list_display = ("id", "file", "item")
    raw_id_fields = ("file", "item")
    show_full_result_count = False
    list_select_related = ("file", "item")


@admin.register(ExternalId)
class ExternalIdAdmin(admin.ModelAdmin[ExternalId]):
    list_display = ("id", "item", "provider", "value")
    list_filter = ("provider",)
    search_fields = ("value",)
    raw_id_fields = ("item",)
    show_full_result_count = False
    list_select_related = ("item",)


# --- per-item coverage: the rows, the backlog page and the outbox (view to read, operate to act;
# the same permissions as runs, orchestrator.api.access). Rows are never edited here: the
# actions call coverage.backlog and coverage.dispatcher.


@admin.register(MediaItemStageState)
class MediaItemStageStateAdmin(pages.ReadOnlyOperated, admin.ModelAdmin[MediaItemStageState]):
    list_display = (
        "item",
        "stage",
        "status",
        "reason",
        "failures",
        "next_eligible_at",
        "run_link",
        "short_error",
    )
    list_filter = ("stage", "status")
    search_fields = ("item__title",)
    list_select_related = ("item",)
    show_full_result_count = False
    actions = ["rescan_items"]
    change_list_template = "admin/coverage/stage_state_change_list.html"

    @admin.display(description="run")
    def run_link(self, row: MediaItemStageState) -> str:
        if not row.run_id:
            return "-"
        url = reverse("admin:orchestrator_taskhistory_change", args=[row.run_id])
        return format_html('<a href="{}">{}</a>', url, row.run_id)

    @admin.display(description="last error")
    def short_error(self, row: MediaItemStageState) -> str:
        return row.last_error[:120]

    @admin.action(description="Rescan selected items now", permissions=["operate"])
    def rescan_items(self, request: HttpRequest, queryset: QuerySet[MediaItemStageState]) -> None:
        actor = request.user.get_username()
        trigger = {"kind": TriggerKind.ADMIN.value, "actor": actor}
        for stage_id, item_id in queryset.values_list("stage", "item_id")[:500]:
            try:
                handle = backlog.rescan(stage_id, item_id, trigger)
            except (LookupError, ValueError, Refused) as exc:
                self.message_user(request, f"{stage_id} item {item_id}: {exc}", messages.WARNING)
                continue
            pages.log_action(
                request, f"rescanned item {item_id} for {stage_id}: run {handle.run_id}"
            )
            self.message_user(request, f"{stage_id} item {item_id}: run {handle.run_id}")

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "backlog/",
                pages.requires(Access.VIEW, self.backlog_view),
                name="coverage_backlog",
            ),
            path(
                "backlog/<str:stage>/heal/",
                pages.requires(Access.OPERATE, self.heal_view),
                name="coverage_heal",
            ),
            *super().get_urls(),
        ]

    def backlog_view(self, request: HttpRequest) -> HttpResponse:
        now = timezone.now()
        stages = backlog.overview()
        page = {
            **admin.site.each_context(request),
            "title": "Coverage backlog",
            "opts": self.model._meta,
            "statuses": list(CoverageStatus.values),
            "stages": [
                {
                    "backlog": b,
                    "counts": [(status, b.counts[status]) for status in CoverageStatus.values],
                    "oldest_age": "-"
                    if b.oldest_due_at is None
                    else describe(max(timedelta(0), now - b.oldest_due_at)),
                }
                for b in stages
            ],
            "can_operate": access.allows(request.user, Access.OPERATE),
        }
        return TemplateResponse(request, "admin/coverage/backlog.html", page)

    def heal_view(self, request: HttpRequest, stage: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            healed = backlog.heal(stage)
        except backlog.UnknownStage as exc:
            raise Http404(str(exc)) from None
        pages.log_action(request, f"healed {healed} rows of {stage}")
        self.message_user(request, f"{stage}: {healed} rows pending again")
        return HttpResponseRedirect(reverse("admin:coverage_backlog"))


@admin.register(EventOutbox)
class EventOutboxAdmin(pages.ReadOnlyOperated, admin.ModelAdmin[EventOutbox]):
    list_display = ("id", "kind", "item_id", "created_at", "attempts", "next_attempt_at", "dead_at")
    list_filter = (("dead_at", admin.EmptyFieldListFilter), "kind")
    readonly_fields = ("last_error",)
    show_full_result_count = False
    actions = ["redeliver_events"]

    @admin.action(description="Redeliver selected dead letters", permissions=["operate"])
    def redeliver_events(self, request: HttpRequest, queryset: QuerySet[EventOutbox]) -> None:
        count = dispatcher.redeliver(list(queryset.values_list("id", flat=True)))
        pages.log_action(request, f"redelivered {count} outbox events")
        self.message_user(request, f"{count} dead-lettered events redelivered")
