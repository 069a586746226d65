"""Every API error has one JSON shape: `{"detail": "...", "errors": [...]}`.

`errors` is present only when there are field errors; each is `{"loc", "msg", "type"}`, `loc`
starting with where the value came from (`body`, `query`, `path`). A refusal by admission
(quota, exclusivity) adds its stable `code` and, when known, a `Retry-After` header. ninja's
own errors (unparseable body, failed schema validation, auth) are rendered in the same shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from orchestrator.api.auth import InvalidToken


class ApiError(Exception):
    """Raised by a view to answer with `status` and the standard error body."""

    def __init__(
        self,
        status: int,
        detail: str,
        errors: Iterable[Mapping[str, Any]] | None = None,
        *,
        code: str | None = None,
        retry_after: timedelta | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = None if errors is None else [field_error(e) for e in errors]
        self.code = code
        self.retry_after = retry_after


def field_error(error: Mapping[str, Any]) -> dict[str, Any]:
    # pydantic errors carry `input`, `ctx` and `url` too; echoing input back could be large
    # and `msg` already says what was expected.
    return {"loc": list(error.get("loc", ())), "msg": error["msg"], "type": error.get("type", "")}


def install(api: NinjaAPI) -> None:
    def respond(request: HttpRequest, status: int, detail: str, **extra: Any) -> HttpResponse:
        body = {"detail": detail, **{k: v for k, v in extra.items() if v is not None}}
        return api.create_response(request, body, status=status)

    @api.exception_handler(ApiError)
    def api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
        response = respond(request, exc.status, exc.detail, code=exc.code, errors=exc.errors)
        if exc.retry_after is not None:
            response["Retry-After"] = str(max(1, math.ceil(exc.retry_after.total_seconds())))
        return response

    @api.exception_handler(ValidationError)
    def invalid_request(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        errors = [field_error(e) for e in exc.errors]
        return respond(request, 422, "the request is invalid", errors=errors)

    @api.exception_handler(AuthenticationError)
    def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        if isinstance(exc, InvalidToken):
            response = respond(request, 401, exc.message)
            response["WWW-Authenticate"] = 'Bearer error="invalid_token"'
        else:
            detail = "authentication required: 'Authorization: Bearer <token>' or a staff session"
            response = respond(request, 401, detail)
            response["WWW-Authenticate"] = "Bearer"
        return response

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        detail = exc.message
        # ninja wraps the parser's exception (e.g. JSONDecodeError) into a bare 400; its text
        # is what tells the client where the body went wrong.
        if exc.__cause__ is not None:
            detail = f"{detail}: {exc.__cause__}"
        return respond(request, exc.status_code, detail)
