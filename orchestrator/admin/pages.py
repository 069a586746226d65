"""What the operator pages share: the permission guard and the admin's page context."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

from orchestrator.api import access, audit
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory

Page = Callable[..., HttpResponse]


def requires(needed: Access, view: Page) -> Page:
    """`view` behind the admin's login (active staff, else a redirect to it) and `needed`
    (else 403)."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not access.allows(request.user, needed):
            raise PermissionDenied(access.refusal(needed))
        return view(request, *args, **kwargs)

    return admin.site.admin_view(guarded)


def log_action(request: HttpRequest, message: str, obj: Model | None = None) -> None:
    """An operator's action in the admin log under their name (`api.audit`), in `obj`'s
    history when given."""
    model = type(obj) if obj is not None else None
    audit.record(request.user, message, model, str(obj.pk) if obj is not None else "")


class ReadOnlyOperated:
    """A model admin's permissions for rows only the system writes: read with view, act (the
    actions marked `permissions=["operate"]`) with operate, never add, change or delete."""

    def has_view_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return access.allows(request.user, Access.VIEW)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return access.allows(request.user, Access.OPERATE)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def context(request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
    """The admin's own context (navigation, user links) for a page filed under Runs."""
    return {
        **admin.site.each_context(request),
        "title": title,
        "opts": TaskHistory._meta,
        **extra,
    }
