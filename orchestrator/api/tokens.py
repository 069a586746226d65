"""API bearer tokens: issued once in clear, stored only as a SHA-256 digest.

A token is `lmt_` + 32 random bytes (URL-safe base64). It carries enough entropy that a
plain, unsalted digest is safe to store and lets a presented token be found by an indexed
equality lookup instead of trying every stored hash.
"""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import User
from django.utils import timezone

from orchestrator.models import ApiToken

TOKEN_PREFIX = "lmt_"  # noqa: S105 - a public marker, not a secret
# "lmt_" plus 8 random characters: enough to tell tokens apart in the admin, too little to guess.
DISPLAY_PREFIX_LENGTH = 12


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(user: User, name: str = "") -> tuple[ApiToken, str]:
    """Create a token for `user`; the clear text is returned here and never again."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = ApiToken.objects.create(
        user=user, name=name, prefix=token[:DISPLAY_PREFIX_LENGTH], digest=digest(token)
    )
    return record, token


def user_for(token: str) -> User | None:
    """The owner of `token`, or None if no such token exists; marks the token as used."""
    record = ApiToken.objects.select_related("user").filter(digest=digest(token)).first()
    if record is None:
        return None
    ApiToken.objects.filter(pk=record.pk).update(last_used_at=timezone.now())
    return record.user
