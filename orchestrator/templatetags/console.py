"""Template filters of the console pages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import template

register = template.Library()


@register.filter
def pairs(mapping: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    """A mapping's (key, value) pairs, by key. `{% for k, v in d.items %}` looks up a key
    named "items" before the method, so a counter or cost kind a task author named `items`
    would break the page; names come from task code, so the pages iterate through this."""
    return sorted((mapping or {}).items())
