"""Signing run events for webhook endpoints, and checking a signature as a receiver does.

`X-Lumastra-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" with the
endpoint's secret>`. The timestamp is inside what is signed, so a delivery cannot be replayed
later with a new one; `check` refuses a signature older (or newer) than its tolerance, one
that does not match the body (tampered) or the secret (forged). `verify`, for receivers of our
deliveries, also refuses, given the ids a receiver has seen, an event delivered again
(receivers deduplicate by `id`: delivery is at least once). Inbound triggers are signed the
same way and checked by the same `check` (`webhooks.inbound`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

from orchestrator.text import is_ascii_digits

HEADER = "X-Lumastra-Signature"
DEFAULT_TOLERANCE = timedelta(minutes=5)


class WebhookVerificationError(ValueError):
    """A delivery that must not be trusted; the message says why."""


class DuplicateDelivery(WebhookVerificationError):
    """A genuine delivery of an event the receiver already had (delivery is at least once):
    answer it 2xx, or it is sent again until it is dead-lettered."""


def sign(body: bytes, secret: str, at: int | None = None) -> str:
    """The signature header's value for `body`, at `at` (unix seconds; now by default)."""
    timestamp = int(time.time()) if at is None else at
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


class Signed(NamedTuple):
    """A signature `check` found genuine and fresh."""

    timestamp: int  # unix seconds, as signed
    digest: str  # the hex HMAC: what tells one signed request from another


def check(
    body: bytes,
    header: str,
    secret: str,
    tolerance: timedelta = DEFAULT_TOLERANCE,
    *,
    now: float | None = None,
) -> Signed:
    """The signature in `header`, once it is found to sign `body` with `secret` within
    `tolerance` of now; raises WebhookVerificationError for a malformed, forged, tampered or
    stale one."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    timestamp, given = parts.get("t", ""), parts.get("v1", "")
    # Seconds since the epoch fit in 12 digits for 30,000 years; a longer number is no time.
    if not is_ascii_digits(timestamp) or len(timestamp) > 12 or not given:
        raise WebhookVerificationError(f"malformed {HEADER} header")
    expected = sign(body, secret, int(timestamp)).split("v1=", 1)[1]
    if not hmac.compare_digest(expected.encode(), given.encode()):
        raise WebhookVerificationError("signature does not match the body and secret")
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > tolerance.total_seconds():
        raise WebhookVerificationError(f"signature is {age:.0f}s old, past the tolerance")
    return Signed(int(timestamp), expected)


def verify(
    body: bytes,
    header: str,
    secret: str,
    tolerance: timedelta = DEFAULT_TOLERANCE,
    *,
    seen: Callable[[str], bool] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The delivered CloudEvent, once its signature is checked; raises
    WebhookVerificationError for a forged, tampered, stale or (with `seen`: called with the
    event id, True when this receiver already had it) replayed delivery."""
    check(body, header, secret, tolerance, now=now)
    try:
        event: dict[str, Any] = json.loads(body)
    except ValueError:
        raise WebhookVerificationError("body is not JSON") from None
    if seen is not None and seen(str(event.get("id", ""))):
        raise DuplicateDelivery(f"event {event.get('id')} was delivered before")
    return event
