"""Admin for the EPG sources (the demo's dynamic schedule rows)."""

from __future__ import annotations

import django_stubs_ext
from django.contrib import admin

from coverage.models import EpgSource

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
