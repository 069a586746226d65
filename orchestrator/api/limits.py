"""Refuses oversized API request bodies with a JSON 413 before any view sees them.

Django enforces `DATA_UPLOAD_MAX_MEMORY_SIZE` (set from `LUMASTRA_API_MAX_BODY_BYTES`) when the
body is first read: from `Content-Length` without reading a byte, and from the bytes actually
received when there is no length (a chunked body under ASGI). Reading the body here, under
that limit, catches both and answers in the API's JSON error shape instead of Django's 400.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

API_PREFIX = "/api/"


class BodySizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            try:
                int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
            try:
                request.body  # noqa: B018 - reading is the check; views get the cached bytes
            except RequestDataTooBig:
                limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
                return JsonResponse(
                    {"detail": f"request body exceeds the limit of {limit} bytes"}, status=413
                )
        return self.get_response(request)
