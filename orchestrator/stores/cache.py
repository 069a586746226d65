"""The cache Valkey (`VALKEY_CACHE_URL`): read models that are costly to compute and may be
lost at any moment, shared by every web replica.

It may evict anything, restart empty or be unreachable: a value not found is computed, and a
cache that fails costs the caller its computation, never its answer (the failure is logged
once a minute, not per call). Nothing the engine decides with is kept here; that is the
coordination Valkey's (`stores.valkey`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import cache

import redis
from django.conf import settings

log = logging.getLogger(__name__)

# How long the cache answers nothing after it failed: a cache that went away must not add a
# connect timeout to every request meanwhile.
OUTAGE_PAUSE_S = 60.0
_down_until = 0.0


@cache
def client() -> redis.Redis:
    # Short timeouts: waiting on a cache longer than the computation it saves is a loss.
    return redis.Redis.from_url(
        settings.CONFIG.valkey_cache_url, socket_timeout=0.5, socket_connect_timeout=0.5
    )


def remembered(key: str, ttl_s: float, compute: Callable[[], bytes]) -> bytes:
    """The value at `key` if the cache holds it, else `compute()`, kept for `ttl_s` seconds
    (0: never cached)."""
    if ttl_s <= 0:
        return compute()
    found = get(key)
    if found is not None:
        return found
    value = compute()
    put(key, value, ttl_s)
    return value


def get(key: str) -> bytes | None:
    """The value at `key`; None when the cache does not hold it or cannot answer."""
    if time.monotonic() < _down_until:
        return None
    try:
        found = client().get(key)
    except redis.RedisError as exc:
        _went_down(exc)
        return None
    return found if isinstance(found, bytes) else None


def put(key: str, value: bytes, ttl_s: float) -> None:
    """Keep `value` at `key` for `ttl_s` seconds, if the cache can."""
    if time.monotonic() < _down_until:
        return
    try:
        client().set(key, value, px=int(ttl_s * 1000))
    except redis.RedisError as exc:
        _went_down(exc)


def _went_down(exc: redis.RedisError) -> None:
    global _down_until
    _down_until = time.monotonic() + OUTAGE_PAUSE_S
    log.warning("the cache Valkey failed (%s): computing without it for a minute", exc)
