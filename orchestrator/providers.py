"""A metadata provider's call (`tasks.providers`: `define_provider`, `providers.call`), from
request handlers and task handlers alike, and what operators see of each provider.

A call, in order:
1. **Cached**: an answer fetched less than the provider's `cache_s` ago, from the cache Valkey
   (`keys.provider_answer`, one per query), is the answer. Answers are kept STALE_S longer
   than `cache_s`, for step 5.
2. **Circuit**: the provider's circuit (`hooks.circuit`, owner `provider:<id>`, the tasks'
   rules: it opens after LUMASTRA_CIRCUIT_FAILURE_THRESHOLD failures in a row or 10 in 30 min,
   then admits one probe call) must admit the call.
3. **Limits**: one unit of each named limit in `limits`, all or none (`hooks.limits.take`),
   waiting for a place up to the provider's timeout; concurrency units are given back after.
4. **Fetch**: `fetch(query)` in a thread of a shared pool (FETCHERS threads), for at most
   `timeout_s`; its answer is cached and counts as a success, an exception or the timeout as a
   failure (a call that found no free fetcher in that time counts neither way, and its fetch
   never runs). A fetch that overran keeps its thread and its limits' places until it returns
   (Python cannot stop a thread); its answer is dropped.
5. **No answer** (circuit open, limit spent, fetch failed): an older cached answer, if one is
   kept, else `ProviderUnavailable`, a `TransientError`.

Counted per provider and outcome (`counters.PROVIDER_CALLS`, on /metrics) with the newest
LATENCIES fetch latencies (`keys.provider_latency`) for p50/p95, in one round trip after the
call. `overview()` reads them with each circuit for the Providers page and the API.

Not guaranteed: FETCHERS fetches that hang leave no thread for any provider until they return
(their callers get no answer, or a stale one, without the circuit counting it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FetchTimeout
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ulid import ULID

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks import circuit, limits
from orchestrator.hooks.base import Refused
from orchestrator.hooks.circuit import CircuitStatus, Verdict
from orchestrator.stores import cache, counters, keys, valkey
from tasks import registry
from tasks.providers import ProviderDefinition, ProviderUnavailable

log = logging.getLogger(__name__)

# How long an answer is kept past its `cache_s`, to answer when the provider cannot.
STALE_S = 86_400
LATENCIES = 1000
FETCHERS = 8
# A fetch's limits' concurrency lease, past its timeout.
LEASE_MARGIN = timedelta(seconds=30)

_fetchers = ThreadPoolExecutor(max_workers=FETCHERS, thread_name_prefix="provider")


def owner(provider_id: str) -> str:
    """The provider's circuit's owner (`hooks.circuit`, `task_circuit_state.task_id`)."""
    return f"provider:{provider_id}"


def call(provider_id: str, query: dict[str, Any], *, clock: Clock = SYSTEM) -> Any:
    """The provider's answer to `query` (see the module). Raises UnknownProvider, ValueError
    for a query that is not a JSON object, or ProviderUnavailable."""
    definition = registry.get().provider(provider_id)
    if not isinstance(query, dict):
        raise ValueError(f"provider {provider_id!r}: the query must be a JSON object")
    try:
        digest = hashlib.sha256(json.dumps(query, sort_keys=True).encode()).hexdigest()[:32]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"provider {provider_id!r}: the query is not JSON: {exc}") from None
    key = keys.provider_answer(provider_id, digest)
    kept = _kept(key) if definition.cache_s else None
    now_s = clock.now().timestamp()
    if kept is not None and now_s - kept[0] < definition.cache_s:
        _count(provider_id, "cached")
        return kept[1]
    try:
        answer, took_ms = _fetched(definition, query, clock)
    except ProviderUnavailable as exc:
        if kept is not None:
            _count(provider_id, "stale")
            log.info("provider %s: %s; answered from its cache", provider_id, exc)
            return kept[1]
        _count(provider_id, "failed")
        raise
    if definition.cache_s:
        cache.put(
            key, json.dumps({"at": now_s, "answer": answer}).encode(), definition.cache_s + STALE_S
        )
    _count(provider_id, "fetched", took_ms)
    return answer


def _fetched(
    definition: ProviderDefinition, query: dict[str, Any], clock: Clock
) -> tuple[Any, float]:
    """A fresh answer under the circuit and the limits, and how long the fetch took (ms)."""
    call_id = f"call_{ULID()}"
    name = owner(definition.id)
    # Waiting for the limits, then the fetch: each up to the timeout.
    hold = 2 * timedelta(seconds=definition.timeout_s) + LEASE_MARGIN
    try:
        circuit.admit_call(name, call_id, hold, clock=clock)
    except Refused as exc:
        raise ProviderUnavailable(str(exc)) from None
    said = Verdict.NEUTRAL  # unless the fetch says otherwise: a probe's slot is freed
    try:
        answer, took_ms = _fetch(definition, query, call_id, hold)
        said = Verdict.SUCCESS
        return answer, took_ms
    except _FetchFailed as failed:
        said = Verdict.FAILURE
        raise ProviderUnavailable(f"provider {definition.id!r}: {failed}") from None
    finally:
        circuit.record_call(name, call_id, said, clock=clock)


class _FetchFailed(Exception):
    """The fetch ran and failed, or ran past the timeout: it counts against the circuit."""


def _fetch(
    definition: ProviderDefinition, query: dict[str, Any], call_id: str, hold: timedelta
) -> tuple[Any, float]:
    held = [limits.Held(registry.get().limits[limit], "") for limit in definition.limits]
    if held and not _took(held, call_id, hold, definition.timeout_s):
        raise ProviderUnavailable(
            f"provider {definition.id!r}: its limits {list(definition.limits)} had no place "
            f"within {definition.timeout_s:g} s"
        )
    started = time.perf_counter()
    fetching = _fetchers.submit(definition.fetch, query)
    if held:
        # Given back when the fetch ends, not when the caller stops waiting: a fetch that
        # overran still holds its place at the remote.
        fetching.add_done_callback(lambda _: limits.give_back(held, call_id, 1, admissions=False))
    try:
        answer = fetching.result(timeout=definition.timeout_s)
        json.dumps(answer)
    except FetchTimeout:
        if fetching.cancel():  # never started: every fetcher was busy, the remote unasked
            raise ProviderUnavailable(
                f"provider {definition.id!r}: no fetcher free within {definition.timeout_s:g} s"
            ) from None
        raise _FetchFailed(f"no answer within {definition.timeout_s:g} s") from None
    except Exception as exc:
        raise _FetchFailed(f"{type(exc).__name__}: {exc}") from None
    return answer, (time.perf_counter() - started) * 1000


def _took(held: list[limits.Held], call_id: str, lease: timedelta, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        taken = limits.take(held, call_id, 1, lease, call_id)
        if taken.taken:
            return True
        delay = taken.delay().total_seconds()
        if time.monotonic() + delay > deadline:
            return False
        time.sleep(delay)


def _kept(key: str) -> tuple[float, Any] | None:
    found = cache.get(key)
    if found is None:
        return None
    try:
        kept = json.loads(found)
        return float(kept["at"]), kept["answer"]
    except (ValueError, KeyError, TypeError):
        return None  # not ours, or damaged: fetched again and replaced


def _count(provider_id: str, outcome: str, took_ms: float | None = None) -> None:
    try:
        pipe = valkey.client().pipeline(transaction=False)
        counters.add(counters.PROVIDER_CALLS, (provider_id, outcome), pipe=pipe)
        if took_ms is not None:
            pipe.lpush(keys.provider_latency(provider_id), round(took_ms, 1))
            pipe.ltrim(keys.provider_latency(provider_id), 0, LATENCIES - 1)
        valkey.execute(pipe)
    except Exception:
        # The answer matters more than its count.
        log.warning("provider %s: its call was not counted", provider_id, exc_info=True)


@dataclass(frozen=True)
class ProviderOverview:
    id: str
    timeout_s: float
    cache_s: int
    limits: tuple[str, ...]
    calls: dict[str, int]  # by outcome: fetched, cached, stale, failed
    p50_ms: float | None
    p95_ms: float | None
    circuit: CircuitStatus

    @property
    def errors(self) -> int:
        """Calls given no fresh answer (a failed or refused fetch, the circuit open, no place
        in a limit): answered stale, or not at all."""
        return self.calls.get("stale", 0) + self.calls.get("failed", 0)


def overview(*, clock: Clock = SYSTEM) -> list[ProviderOverview]:
    """Every provider with its counts, latency and circuit, in two round trips."""
    providers = sorted(registry.get().providers.values(), key=lambda p: p.id)
    if not providers:
        return []
    pipe = valkey.client().pipeline(transaction=False)
    pipe.hgetall(keys.metrics(counters.PROVIDER_CALLS))
    for provider in providers:
        pipe.lrange(keys.provider_latency(provider.id), 0, -1)
    counted, *latencies = valkey.execute(pipe)
    circuits = circuit.statuses([owner(p.id) for p in providers], clock=clock)
    calls: dict[str, dict[str, int]] = {}
    for field, count in counted.items():
        provider_id, _, outcome = field.partition("|")
        calls.setdefault(provider_id, {})[outcome] = int(count)
    return [
        ProviderOverview(
            provider.id,
            provider.timeout_s,
            provider.cache_s,
            provider.limits,
            calls.get(provider.id, {}),
            *_percentiles([float(ms) for ms in took]),
            circuits[owner(provider.id)],
        )
        for provider, took in zip(providers, latencies, strict=True)
    ]


def _percentiles(took: list[float]) -> tuple[float | None, float | None]:
    if len(took) < 2:
        return (took[0], took[0]) if took else (None, None)
    cuts = statistics.quantiles(took, n=100, method="inclusive")
    return round(cuts[49], 1), round(cuts[94], 1)
