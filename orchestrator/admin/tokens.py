"""API tokens in the admin: listed and revoked (deleted), never created or shown here."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from orchestrator.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    """Tokens are created by `manage.py create_api_token`, which shows the secret once."""

    list_display = ["user", "name", "prefix", "created_at", "last_used_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "name", "prefix"]
    # Never the digest: it is all a stolen database dump would need to check guesses against.
    fields = ["user", "name", "prefix", "created_at", "last_used_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False
