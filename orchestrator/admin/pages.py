"""What the operator pages share: the permission guard and the admin's page context."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

from orchestrator.api import access
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
    """An operator's action in the admin log ("Recent actions", and the object's history when
    `obj` is given), under their name: who cancelled, retried, started, force-enabled,
    healed, rescanned or redelivered what."""
    content_type = ContentType.objects.get_for_model(obj) if obj is not None else None
    LogEntry.objects.create(
        user_id=int(request.user.pk or 0),
        content_type=content_type,
        object_id=str(obj.pk) if obj is not None else None,
        object_repr=message[:200],
        action_flag=CHANGE,
        change_message=message,
    )


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
