"""Every API error has one JSON shape: `{"detail": "...", "errors": [...]}`.

`errors` is present only when there are field errors; each is `{"loc", "msg", "type"}`, `loc`
starting with where the value came from (`body`, `query`, `path`). A refusal by admission
(quota, exclusivity) adds its stable `code` and, when known, a `Retry-After` header. ninja's
own errors (unparseable body, failed schema validation, auth) are rendered in the same shape,
and so are a path no operation serves (404) and a method the path does not take (405).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern
from django.views.decorators.csrf import csrf_exempt
from ninja import Field, NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

log = logging.getLogger(__name__)


class InvalidToken(AuthenticationError):
    """Credentials were presented and are wrong (RFC 6750 `invalid_token`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


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


class FieldErrorOut(Schema):
    loc: list[str | int] = Field(description="where: body, query or path, then the field")
    msg: str
    type: str


class ErrorOut(Schema):
    detail: str
    code: str | None = Field(
        default=None, description="a refusal's stable code, e.g. quota_exceeded"
    )
    errors: list[FieldErrorOut] | None = Field(default=None, description="field errors")


# What any operation can answer: a malformed request or body (400), no or bad credentials
# (401), an account, session or CSRF token the API refuses (403), a body over the limit
# (413), too many failed authentication attempts from one address (429), and a store it
# needs (Postgres, Valkey, the broker) unreachable (503).
EVERY_OPERATION = (400, 401, 403, 413, 429, 503)
# A store that went away (a restart, a failover) is usually back within seconds.
STORE_RETRY_AFTER = timedelta(seconds=5)


def answers(ok: Mapping[int, Any], *errors: int) -> dict[int, Any]:
    """An operation's `response=`: its successes, then `errors` and EVERY_OPERATION's
    statuses with the error body, so the OpenAPI schema lists all it can answer."""
    return {**ok, **{status: ErrorOut for status in sorted({*EVERY_OPERATION, *errors})}}


# Exempt like ninja's views: a write to a path that does not exist is a 404, not a CSRF 403.
@csrf_exempt
def no_endpoint(request: HttpRequest) -> HttpResponse:
    """Anything under /api/ that no operation serves."""
    return JsonResponse({"detail": f"no API endpoint at {request.path}"}, status=404)


def json_405(pattern: URLPattern) -> URLPattern:
    """`pattern` with ninja's plain-text 405 answered in the error shape instead."""
    view: Callable[..., HttpResponse] = pattern.callback

    # `wraps` carries the view's attributes over, ninja's `csrf_exempt` among them.
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if response.status_code != 405:
            return response
        allowed = ", ".join(sorted(m.strip() for m in response["Allow"].split(",")))
        refused = JsonResponse(
            {"detail": f"{request.method} is not allowed here; use {allowed}"}, status=405
        )
        refused["Allow"] = allowed
        return refused

    return URLPattern(pattern.pattern, wrapped, pattern.default_args, pattern.name)


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

    # Only outages: a query Postgres refused for its content (IntegrityError, ...) is a bug,
    # and still a 500.
    @api.exception_handler(ValkeyConnectionError)
    @api.exception_handler(ValkeyTimeoutError)
    @api.exception_handler(OperationalError)
    @api.exception_handler(InterfaceError)
    def store_unreachable(request: HttpRequest, exc: Exception) -> HttpResponse:
        log.error("API %s %s: a store is unreachable: %s", request.method, request.path, exc)
        response = respond(
            request, 503, "a store the API needs is unreachable; retry later", code="unavailable"
        )
        response["Retry-After"] = str(math.ceil(STORE_RETRY_AFTER.total_seconds()))
        return response

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        detail = exc.message
        # ninja wraps the parser's exception (e.g. JSONDecodeError) into a bare 400; its text
        # is what tells the client where the body went wrong.
        if exc.__cause__ is not None:
            detail = f"{detail}: {exc.__cause__}"
        return respond(request, exc.status_code, detail)
