"""The coordination Valkey client, one connection pool per process (fork-safe in redis-py),
and the two helpers every caller of it shares."""

from __future__ import annotations

import asyncio
import weakref
from functools import cache
from typing import Any, cast

import redis
import redis.asyncio
from django.conf import settings
from redis.client import Pipeline

# How long a handler's own thread sends nothing more to Valkey after a send failed (its cancel
# check, an inline log or progress flush): the watch's threads keep trying meanwhile, so a store
# that went away costs the handler one store timeout, not one per line or report.
OUTAGE_PAUSE_S = 10.0


def _options() -> dict[str, Any]:
    # A connection whose path went dead (a partition) fails within the store timeout instead
    # of hanging its thread until the kernel gives up (`lumastra/settings.py` does the same
    # for Postgres). A pub/sub wait with its own timeout is not cut by it.
    timeout = settings.CONFIG.store_timeout_s
    return {
        "decode_responses": True,
        "health_check_interval": 30,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "socket_keepalive": True,
    }


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.CONFIG.valkey_url, **_options())


_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
    weakref.WeakKeyDictionary()
)


def async_client() -> redis.asyncio.Redis:
    """A client for the running event loop (the web role's ASGI loop: event streams), one pool
    per loop, as an asyncio connection cannot move between loops."""
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is None:
        found = redis.asyncio.Redis.from_url(settings.CONFIG.valkey_url, **_options())
        _async_clients[loop] = found
    return found


def execute(pipe: Pipeline, *, raise_on_error: bool = True) -> list[Any]:
    """Send a pipeline's commands; their replies, in order (errors as values when
    `raise_on_error` is False). The one typed place for redis-py's untyped `execute`."""
    return cast(list[Any], pipe.execute(raise_on_error=raise_on_error))  # type: ignore[no-untyped-call]


def time_ms(reply: tuple[int | str, int | str]) -> int:
    """Valkey's TIME reply (seconds, microseconds) in milliseconds, as Lua scripts compute it."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
