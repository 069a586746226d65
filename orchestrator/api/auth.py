"""Who may call the API: active staff, by bearer token or by Django session.

A request that presents an `Authorization` header is judged by that header alone: a bad token
is a 401 even when a session cookie rides along, so a client never silently acts under a
different identity than the one it sent. Without the header the session is used, with
Django's CSRF check. No credentials or a bad token → 401 (`WWW-Authenticate: Bearer`);
a known user who is not active staff → 403.
"""

from __future__ import annotations

from typing import cast

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja.errors import AuthenticationError, AuthorizationError, HttpError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.security.base import AuthBase
from ninja.utils import check_csrf

from orchestrator.api import tokens


class InvalidToken(AuthenticationError):
    """Credentials were presented and are wrong (RFC 6750 `invalid_token`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


def _staff_only(user: User) -> User:
    if not (user.is_active and user.is_staff):
        raise AuthorizationError(message="the API is open to active staff accounts only")
    return user


class BearerToken(HttpBearer):
    def __call__(self, request: HttpRequest) -> User | None:
        header = request.headers.get(self.header)
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise InvalidToken("Authorization must be 'Bearer <token>'")
        return self.authenticate(request, token.strip())

    def authenticate(self, request: HttpRequest, token: str) -> User:
        user = tokens.user_for(token)
        if user is None:
            raise InvalidToken("unknown API token")
        return _staff_only(user)


class StaffSession(APIKeyCookie):
    param_name = settings.SESSION_COOKIE_NAME

    # ninja's SessionAuth checks CSRF before knowing whether anyone is logged in, which
    # turns an anonymous POST into a 403; checking only for a logged-in session keeps that
    # case a 401.
    def __call__(self, request: HttpRequest) -> User | None:
        if not request.user.is_authenticated:
            return None
        if self.csrf and check_csrf(request):
            raise HttpError(403, "CSRF check failed")
        return self.authenticate(request, None)

    def authenticate(self, request: HttpRequest, key: str | None) -> User:
        return _staff_only(cast(User, request.user))


AUTH: list[AuthBase] = [BearerToken(), StaffSession()]


def current_user(request: HttpRequest) -> User:
    """The user one of `AUTH` admitted (ninja stores it as `request.auth`)."""
    return cast(User, request.auth)  # type: ignore[attr-defined]
