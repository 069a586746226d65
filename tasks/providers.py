"""Metadata providers (issue 41): `define_provider` and `call`, a remote API's answers for
request handlers and task handlers alike.

    def fetch_poster(query: dict[str, str]) -> dict[str, str] | None:
        ...  # one request to the remote API; raise to say it failed

    metadata = define_provider(
        "metadata", fetch=fetch_poster, timeout_s=5, limits=("tmdb",), cache_s=3600
    )

    answer = providers.call("metadata", {"provider": "tmdb", "id": "603"})

`fetch` gets the query (a JSON object) and returns a JSON value. The engine calls it under the
provider's circuit breaker (the tasks' rules: it opens after repeated failures, then lets one
call probe), takes one unit of each named limit in `limits` first, gives it `timeout_s`, and
keeps its answers for `cache_s` seconds in the cache Valkey; a call whose fetch fails, times out
or finds the circuit open is answered from an older cached answer when there is one, else it
raises `ProviderUnavailable` (a `TransientError`: a task that meets it is retried later).
Calls, errors, latency and the circuit are on the console's Providers page and
`GET /api/v1/providers` (`orchestrator.providers`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tasks.errors import ManifestError, TransientError

_PROVIDER_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class ProviderUnavailable(TransientError):
    """The provider gave no answer (failed, timed out, circuit open, limit spent) and none is
    cached."""


class UnknownProvider(LookupError):
    def __init__(self, provider_id: str) -> None:
        super().__init__(provider_id)
        self.provider_id = provider_id

    def __str__(self) -> str:
        return f"unknown provider {self.provider_id!r}"


@dataclass(frozen=True)
class ProviderDefinition:
    id: str
    fetch: Callable[[dict[str, Any]], Any]
    timeout_s: float
    limits: tuple[str, ...]
    cache_s: int


def define_provider(
    id: str,
    *,
    fetch: Callable[[dict[str, Any]], Any],
    timeout_s: float = 10.0,
    limits: tuple[str, ...] = (),
    cache_s: int = 3600,
) -> ProviderDefinition:
    """Declare a provider. Assign the result to a module-level name in a module the registry
    loads; call it with `providers.call(id, query)`."""

    def fail(field: str, problem: str) -> ManifestError:
        return ManifestError(id, field, problem, what="provider")

    if not isinstance(id, str) or not _PROVIDER_ID.match(id):
        raise fail("id", "must be lowercase letters, digits and dashes, starting with a letter")
    if not callable(fetch):
        raise fail("fetch", "must be a function of the query")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise fail("timeout_s", "must be a number of seconds")
    if not 0 < timeout_s <= 300:
        raise fail("timeout_s", "must be more than 0 and at most 300 seconds")
    if not isinstance(limits, tuple) or not all(isinstance(name, str) for name in limits):
        raise fail("limits", "must be a tuple of limit ids")
    if isinstance(cache_s, bool) or not isinstance(cache_s, int) or cache_s < 0:
        raise fail("cache_s", "must be a whole number of seconds, 0 for no cache")
    return ProviderDefinition(id, fetch, float(timeout_s), limits, cache_s)


class Caller(Protocol):
    def __call__(self, provider_id: str, query: dict[str, Any]) -> Any: ...


_caller: Caller | None = None


def install(caller: Caller) -> None:
    """The engine's call (`orchestrator.providers.call`); installed once at startup, so the SDK
    depends on no engine module."""
    global _caller
    _caller = caller


def call(provider_id: str, query: dict[str, Any]) -> Any:
    """The provider's answer to `query`: cached, or fetched under its circuit, limits and
    timeout. Raises UnknownProvider, or ProviderUnavailable when there is no answer."""
    if _caller is None:
        raise RuntimeError("providers.call before the engine started (orchestrator.apps)")
    return _caller(provider_id, query)
