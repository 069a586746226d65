"""The coordination Valkey client, one connection pool per process (fork-safe in redis-py),
and the two helpers every caller of it shares."""

from __future__ import annotations

from functools import cache
from typing import Any, cast

import redis
from django.conf import settings
from redis.client import Pipeline


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(
        settings.CONFIG.valkey_url, decode_responses=True, health_check_interval=30
    )


def execute(pipe: Pipeline, *, raise_on_error: bool = True) -> list[Any]:
    """Send a pipeline's commands; their replies, in order (errors as values when
    `raise_on_error` is False). The one typed place for redis-py's untyped `execute`."""
    return cast(list[Any], pipe.execute(raise_on_error=raise_on_error))  # type: ignore[no-untyped-call]


def time_ms(reply: tuple[int | str, int | str]) -> int:
    """Valkey's TIME reply (seconds, microseconds) in milliseconds, as Lua scripts compute it."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
