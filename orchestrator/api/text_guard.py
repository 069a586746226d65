"""One guard, at the request, for text no page can store: a NUL or a lone surrogate in the
path, a query parameter or a form field is a 400 naming where it was.

Postgres refuses NUL in text, so a filter value such as `?state=%00` reached the database
and failed there, as a 500, on every changelist (django-celery-beat's pages too). Checking
each page's parameters would miss the next one; checking the request covers them all.

The API is left to its own edge: its field types (`fields`) answer the same text with a
documented 422 naming the field.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict

from orchestrator.api.limits import API_PREFIX
from orchestrator.text import unstorable


class StorableTextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX) and (refusal := _refusal(request)):
            return HttpResponseBadRequest(refusal, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


def _refusal(request: HttpRequest) -> str | None:
    if reason := unstorable(request.path):
        return f"the path {reason}"
    sources: list[tuple[str, QueryDict]] = [("query parameter", request.GET)]
    if request.method == "POST":
        sources.append(("form field", request.POST))
    for where, fields in sources:
        for name, values in fields.lists():
            for text in (name, *values):
                if reason := unstorable(text):
                    return f"the {where} {name!r} {reason}"
    return None
