"""Admin for the EPG sources (the demo's dynamic schedule rows) and the media catalog."""

from __future__ import annotations

import django_stubs_ext
from django.contrib import admin

from coverage.models import EpgSource, ExternalId, MediaFile, MediaFileItem, MediaItem

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
