"""Who may call the API: active staff with the operation's permission, by bearer token or by
Django session.

A request that presents an `Authorization` header is judged by that header alone: a bad token
is a 401 even when a session cookie rides along, so a client never silently acts under a
different identity than the one it sent. Without the header the session is used, with
Django's CSRF check. No credentials or a bad token → 401 (`WWW-Authenticate: Bearer`); a known
user who is not active staff, or lacks the operation's permission (`orchestrator.api.access`),
→ 403. Bad tokens count against the client address's sign-in budget
(`orchestrator.api.throttle`); past it every token from that address is a 429 until the
window ends.

Each operation names what it needs: `auth=VIEW` for reads, `auth=OPERATE` for the rest. The
API's default (`AUTH`) is operate, so an operation that forgets to say is closed, not open.
"""

from __future__ import annotations

from typing import cast

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja.errors import AuthorizationError, HttpError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.security.base import AuthBase
from ninja.utils import check_csrf

from orchestrator.api import access, throttle, tokens
from orchestrator.api.access import Access
from orchestrator.api.errors import ApiError, InvalidToken


def _admit(user: User, needed: Access) -> User:
    if not (user.is_active and user.is_staff):
        raise AuthorizationError(message="the API is open to active staff accounts only")
    if not access.allows(user, needed):
        raise AuthorizationError(message=access.refusal(needed))
    return user


def unthrottled_address(request: HttpRequest) -> str:
    """The client's address, once its failed sign-ins leave it free to try credentials (a
    token, an inbound trigger's signature); else the 429 that says how long to wait."""
    address = throttle.client_address(request)
    wait = throttle.blocked_for(address)
    if wait is not None:
        raise ApiError(
            429, throttle.refusal(wait), code="too_many_failed_sign_ins", retry_after=wait
        )
    return address


class BearerToken(HttpBearer):
    def __init__(self, needed: Access) -> None:
        super().__init__()
        self.needed = needed

    def __call__(self, request: HttpRequest) -> User | None:
        header = request.headers.get(self.header)
        if header is None:
            return None
        address = unthrottled_address(request)
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            throttle.record_failure(address)
            raise InvalidToken("Authorization must be 'Bearer <token>'")
        return self.authenticate(request, token.strip())

    def authenticate(self, request: HttpRequest, token: str) -> User:
        record = tokens.find(token)
        if record is None:
            throttle.record_failure(throttle.client_address(request))
            raise InvalidToken("unknown API token")
        user = _admit(record.user, self.needed)
        tokens.mark_used(record)
        return user


class StaffSession(APIKeyCookie):
    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, needed: Access) -> None:
        super().__init__()
        self.needed = needed

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
        return _admit(cast(User, request.user), self.needed)


VIEW: list[AuthBase] = [BearerToken(Access.VIEW), StaffSession(Access.VIEW)]
OPERATE: list[AuthBase] = [BearerToken(Access.OPERATE), StaffSession(Access.OPERATE)]
AUTH = OPERATE


def current_user(request: HttpRequest) -> User:
    """The user one of `AUTH` admitted (ninja stores it as `request.auth`)."""
    return cast(User, request.auth)  # type: ignore[attr-defined]
