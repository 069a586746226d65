"""Failed sign-ins per client address: a bad API bearer token and a failed admin login draw
on one budget, so an attacker cannot double it by trying both doors.

Each failure increments a counter in the coordination Valkey (`keys.auth_failures`), whose
window opens at the address's first failure and lasts `LUMASTRA_AUTH_FAILURE_WINDOW_S`. Once
it holds `LUMASTRA_AUTH_FAILURE_LIMIT` failures, every sign-in attempt from the address, right
or wrong, is refused (429 with `Retry-After`) until the window ends: were a right one let
through, the refusals would tell an attacker which guess was right. A successful sign-in is not
counted and does not reset the count; a browser session already signed in is not an attempt.

What it does not guarantee: the address is the one the web server reports (`REMOTE_ADDR`;
behind a reverse proxy, uvicorn's `--forwarded-allow-ips` decides whether that is the client
or the proxy), so clients sharing an address share a budget, and an attacker with many
addresses gets the limit once per address.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest

from orchestrator.stores import keys, valkey


def client_address(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def blocked_for(address: str) -> timedelta | None:
    """How long `address` must wait before it may try to sign in again; None: it may now."""
    pipe = valkey.client().pipeline(transaction=True)
    pipe.get(keys.auth_failures(address))
    pipe.pttl(keys.auth_failures(address))
    count, ttl_ms = valkey.execute(pipe)
    if count is None or int(count) < settings.CONFIG.auth_failure_limit:
        return None
    # A counter always has its expiry (set with it, below); at least a second is what
    # Retry-After can say.
    return timedelta(milliseconds=max(int(ttl_ms), 1000))


def record_failure(address: str) -> None:
    """Count one failed sign-in from `address`; the first of a window starts the window."""
    pipe = valkey.client().pipeline(transaction=True)
    pipe.incr(keys.auth_failures(address))
    pipe.expire(keys.auth_failures(address), settings.CONFIG.auth_failure_window_s, nx=True)
    valkey.execute(pipe)


def refusal(wait: timedelta) -> str:
    """What a throttled caller is told."""
    return (
        "too many failed sign-ins from this address; "
        f"try again in {max(1, math.ceil(wait.total_seconds()))} s"
    )
