"""Operators' actions in the admin log ("Recent actions", and an object's history): who
cancelled, retried, started, force-enabled, paused or requeued what, from the console's pages
and from the operator CLI alike."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model


def record(user: Any, message: str, model: type[Model] | None = None, object_id: str = "") -> None:
    """`message` under `user`'s name; in the history of `model`'s row `object_id` too."""
    LogEntry.objects.create(
        user_id=int(user.pk or 0),
        content_type=ContentType.objects.get_for_model(model) if model is not None else None,
        object_id=object_id or None,
        object_repr=message[:200],
        action_flag=CHANGE,
        change_message=message,
    )
