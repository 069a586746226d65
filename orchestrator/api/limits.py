"""Refuses oversized API request bodies with a JSON 413 before anything reads them."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

API_PREFIX = "/api/"


class BodySizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            limit = settings.CONFIG.api_max_body_bytes
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
            if length > limit:
                return JsonResponse(
                    {"detail": f"request body of {length} bytes exceeds the limit of {limit}"},
                    status=413,
                )
        return self.get_response(request)
