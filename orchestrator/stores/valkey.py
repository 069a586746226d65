"""The coordination Valkey client, one connection pool per process (fork-safe in redis-py)."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(
        settings.CONFIG.valkey_url, decode_responses=True, health_check_interval=30
    )
