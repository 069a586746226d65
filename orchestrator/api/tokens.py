"""API bearer tokens: issued once in clear, stored only as a SHA-256 digest.

A token is `lmt_` + 32 random bytes (URL-safe base64). It carries enough entropy that a
plain, unsalted digest is safe to store and lets a presented token be found by an indexed
equality lookup instead of trying every stored hash.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone

from orchestrator.models import ApiToken

TOKEN_PREFIX = "lmt_"  # noqa: S105 - a public marker, not a secret
# "lmt_" plus 8 random characters: enough to tell tokens apart in the admin, too little to guess.
DISPLAY_PREFIX_LENGTH = 12
# `last_used_at` is as fine as this: enough to tell a live token from a forgotten one.
STAMP_EVERY = timedelta(minutes=1)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(user: User, name: str = "") -> tuple[ApiToken, str]:
    """Create a token for `user`; the clear text is returned here and never again."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = ApiToken.objects.create(
        user=user, name=name, prefix=token[:DISPLAY_PREFIX_LENGTH], digest=digest(token)
    )
    return record, token


def find(token: str) -> ApiToken | None:
    """The record of `token` with its user, or None if no such token exists. Reads only."""
    return ApiToken.objects.select_related("user").filter(digest=digest(token)).first()


def mark_used(record: ApiToken) -> None:
    """Record that `record` was accepted: at most once per STAMP_EVERY, so a busy client does
    not turn every read into a write to api_token."""
    now = timezone.now()
    if record.last_used_at is not None and now - record.last_used_at < STAMP_EVERY:
        return
    # Guarded again in SQL: of concurrent requests with one token, one stamp lands.
    ApiToken.objects.filter(pk=record.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - STAMP_EVERY)
    ).update(last_used_at=now)
