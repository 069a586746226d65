"""Admin for the EPG sources (the demo's dynamic schedule rows), the media catalog and its
per-item coverage: the rows, the backlog page (heal), rescans and the outbox's dead letters."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import django_stubs_ext
from django.conf import settings
from django.contrib import admin, messages
from django.db import connection
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
from django.views.decorators.http import require_POST

from coverage import backlog, dead_letters, dispatcher, library, queries
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
from coverage.stages import covered
from orchestrator.admin import pages
from orchestrator.admin.paginator import EstimatedCountPaginator
from orchestrator.api import access
from orchestrator.api.access import Access
from orchestrator.clock import describe
from orchestrator.hooks.base import Refused
from orchestrator.runs.handle import StartRefused
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


class _IndexedValuesFilter(admin.SimpleListFilter):
    """A filter on a column with few values, listed by a named query that skips along the
    column's index (`coverage/sql/<query>.sql`) instead of the admin's DISTINCT over every
    row."""

    query: str

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute(queries.render(self.query))
            return [(value, value) for (value,) in cursor.fetchall()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{str(self.parameter_name): value}) if value else queryset


class LibraryFilter(_IndexedValuesFilter):
    title = "library"
    parameter_name = "library"
    query = "libraries"


class ProviderFilter(_IndexedValuesFilter):
    title = "provider"
    parameter_name = "provider"
    query = "providers"


class StageFilter(admin.SimpleListFilter):
    # The covered stages from the registry: a DISTINCT over the rows would read all of them.
    title = "stage"
    parameter_name = "stage"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(c.id, c.id) for c in sorted(covered(), key=lambda c: c.id)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(stage=value) if value else queryset


# The catalog can hold a million items: no full counts, counts past 10,000 rows estimated
# (EstimatedCountPaginator), and foreign keys as raw ids (a select of every item would be
# enormous).


@admin.register(MediaItem)
class MediaItemAdmin(admin.ModelAdmin[MediaItem]):
    list_display = ("id", "kind", "title", "year", "index_number", "library", "parent")
    list_filter = ("kind", LibraryFilter)
    search_fields = ("title",)
    raw_id_fields = ("parent",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_select_related = ("parent",)


@admin.register(MediaFile)
class MediaFileAdmin(admin.ModelAdmin[MediaFile]):
    list_display = ("id", "path", "size", "is_missing", "probed_at", "content_hash")
    list_filter = ("is_missing",)
    search_fields = ("path",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator


@admin.register(MediaFileItem)
class MediaFileItemAdmin(admin.ModelAdmin[MediaFileItem]):
    list_display = ("id", "file", "item")
    raw_id_fields = ("file", "item")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_select_related = ("file", "item")


@admin.register(ExternalId)
class ExternalIdAdmin(admin.ModelAdmin[ExternalId]):
    list_display = ("id", "item", "provider", "value")
    list_filter = (ProviderFilter,)
    search_fields = ("value",)
    raw_id_fields = ("item",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
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
    list_filter = (StageFilter, "status")
    search_fields = ("item__title",)
    list_select_related = ("item",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
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
                self.message_user(
                    request, f"Stage {stage_id}, item {item_id}: {exc}", messages.WARNING
                )
                continue
            pages.log_action(
                request, f"rescanned item {item_id} for {stage_id}: run {handle.run_id}"
            )
            self.message_user(request, f"Stage {stage_id}, item {item_id}: run {handle.run_id}")

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
            path(
                "backlog/rescan/",
                pages.requires(Access.OPERATE, require_POST(self.rescan_view)),
                name="coverage_rescan",
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
            "media_roots": [str(root) for root in settings.CONFIG.media_roots],
        }
        return TemplateResponse(request, "admin/coverage/backlog.html", page)

    def rescan_view(self, request: HttpRequest) -> HttpResponse:
        folder = request.POST.get("path", "")
        trigger = {"kind": TriggerKind.ADMIN.value, "actor": request.user.get_username()}
        try:
            handle = library.start_rescan(folder, trigger)
        except (library.OutsideRoots, StartRefused, Refused) as exc:
            self.message_user(request, f"Not rescanned: {exc}", messages.WARNING)
        else:
            pages.log_action(request, f"rescanned {folder} (run {handle.run_id})")
            self.message_user(request, f"{folder}: rescan run {handle.run_id} queued")
        return HttpResponseRedirect(reverse("admin:coverage_backlog"))

    def heal_view(self, request: HttpRequest, stage: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            healed = backlog.heal(stage)
        except backlog.UnknownStage as exc:
            raise Http404(str(exc)) from None
        pages.log_action(request, f"healed {healed} rows of {stage}")
        self.message_user(request, f"Stage {stage}: {healed} rows pending again")
        return HttpResponseRedirect(reverse("admin:coverage_backlog"))


@admin.register(EventOutbox)
class EventOutboxAdmin(pages.ReadOnlyOperated, admin.ModelAdmin[EventOutbox]):
    list_display = ("id", "kind", "item_id", "created_at", "attempts", "next_attempt_at", "dead_at")
    list_filter = (("dead_at", admin.EmptyFieldListFilter), "kind")
    readonly_fields = ("last_error",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ["redeliver_events"]

    @admin.action(description="Redeliver selected dead letters", permissions=["operate"])
    def redeliver_events(self, request: HttpRequest, queryset: QuerySet[EventOutbox]) -> None:
        count = dispatcher.redeliver(list(queryset.values_list("id", flat=True)))
        pages.log_action(request, f"redelivered {count} outbox events")
        self.message_user(request, f"{count} dead-lettered events redelivered")

    def get_urls(self) -> list[URLPattern]:
        # The Dead letters page's redeliver button (coverage.dead_letters).
        redeliver = pages.requires(Access.OPERATE, require_POST(dead_letters.redeliver_view))
        return [
            path("dead-letters/redeliver/", redeliver, name="coverage_outbox_redeliver"),
            *super().get_urls(),
        ]
