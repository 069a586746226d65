"""Inbound triggers' signed requests: checked with the scheme our own deliveries are signed
with (`signing.check`: `X-Lumastra-Signature: t=<unix seconds>,v1=<HMAC-SHA256 of "<t>.<body>">`
with the trigger's secret), and each accepted once.

`accept` refuses a malformed, forged, tampered or stale signature (`signing`'s
WebhookVerificationError) and one it has accepted before (`Replayed`): the digest of every
accepted signature is kept in the coordination Valkey (`keys.trigger_signature`, SET NX) until
its timestamp leaves the tolerance, after which `check` refuses it as stale anyway. `release`
forgets one whose request then started nothing (a refused start), so the caller may send the
same request again.

What it does not guarantee: a request is remembered by its signature, not by what it asks
for. The same body signed again with a new timestamp is a new request; an integration that
retries should send an `Idempotency-Key`, which `start_run` deduplicates while the run is live.
A Valkey that loses its keys (not persistent) forgets what it had accepted, and a request
accepted just before could then be replayed within the tolerance.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta

from orchestrator.stores import keys, valkey
from orchestrator.webhooks.signing import Signed, WebhookVerificationError, check

# The key outlives the tolerance by this much, so a clock a little behind Valkey's cannot let
# a request in again in its last moment.
_MARGIN_S = 1.0


class Replayed(WebhookVerificationError):
    """A genuine signed request that was accepted before."""


def accept(
    trigger: str,
    body: bytes,
    header: str,
    secret: str,
    tolerance: timedelta,
    *,
    now: float | None = None,
) -> Signed:
    """The request's signature, once it is genuine, fresh and new; raises
    WebhookVerificationError (Replayed for a request accepted before)."""
    now = time.time() if now is None else now
    signed = check(body, header, secret, tolerance, now=now)
    # Until the timestamp leaves the tolerance: from then on `check` refuses it as stale.
    keep_s = signed.timestamp + tolerance.total_seconds() - now + _MARGIN_S
    fresh = valkey.client().set(
        keys.trigger_signature(trigger, signed.digest), "1", nx=True, px=math.ceil(keep_s * 1000)
    )
    if not fresh:
        raise Replayed(f"this signed request to trigger {trigger!r} was accepted before")
    return signed


def release(trigger: str, signed: Signed) -> None:
    """Forget an accepted request that started nothing, so it may be sent again."""
    valkey.client().delete(keys.trigger_signature(trigger, signed.digest))
