"""Providers the test suite calls (issue 41): one whose remote answers or fails at the test's
word (a Valkey hash, so a worker's calls obey it too), one too slow for its timeout, one behind
a limit with a single place."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.stores import valkey
from tasks import define_limit, define_provider

# field "mode": "ok" (the default) or "fail"; field "fetches": how many fetches ran.
REMOTE_KEY = "test:provider:remote"


def _remote(query: dict[str, Any]) -> dict[str, Any]:
    client = valkey.client()
    fetches = client.hincrby(REMOTE_KEY, "fetches", 1)
    if client.hget(REMOTE_KEY, "mode") == "fail":
        raise ConnectionError("the remote answered 503")
    return {"q": query.get("q"), "fetch": fetches}


def _slow(query: dict[str, Any]) -> str:
    time.sleep(2)
    return "late"


remote = define_provider("test-remote", fetch=_remote, timeout_s=2, cache_s=60)
slow = define_provider("test-slow", fetch=_slow, timeout_s=0.2, cache_s=0)
one_place = define_limit("test-provider-place", concurrency=1)
limited = define_provider(
    "test-limited", fetch=_remote, timeout_s=0.3, limits=("test-provider-place",), cache_s=0
)
