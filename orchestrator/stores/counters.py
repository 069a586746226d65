"""Cluster-wide counters for /metrics, kept in the coordination Valkey (never per process, so
every web replica scraped reports the same totals).

One hash per family, `metrics:<family>`, a field per label set (`"<task>|<state>"`, ...),
incremented by the code that sees the event, in a pipeline it already sends where it has one.
Counters only grow; a Valkey that lost them (no AOF) restarts them from zero, which
Prometheus reads as a counter reset.
"""

from __future__ import annotations

from typing import Any

from redis.client import Pipeline

from orchestrator.stores import keys, valkey

# Families and their labels (the order of the parts of a field).
RUNS = "runs_total"  # task, state
DURATION = "duration"  # task (histogram buckets, sum, count: end_run.lua)
COST = "cost_units_total"  # task, kind
REFUSALS = "refusals_total"  # task, code
DELIVERY = "delivery_total"  # event: published, redelivered, duplicate_dropped
# event: orphans_put_back, orphans_failed, republished, drain_replayed, poisoned
RECOVERY = "recovery_total"
SCHEDULE_SKIPS = "schedule_skips_total"  # task: slots skipped, the previous fire's run live
SCHEDULE_PAUSES = "schedule_paused_total"  # task: switched off by pause_on_failure
# provider, outcome: fetched, cached, stale, failed (no answer given)
PROVIDER_CALLS = "provider_calls_total"
# task, outcome: started, deduplicated, debounced, coalesced, throttled, dropped
START_OUTCOMES = "start_outcomes_total"
# Upper bounds (seconds) of the run duration histogram's buckets.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


def field(*labels: str) -> str:
    return "|".join(labels)


def add(family: str, labels: tuple[str, ...], n: float = 1, pipe: Pipeline | None = None) -> None:
    """Count `n` under `labels`: queued on `pipe` if given, else sent alone."""
    target = pipe if pipe is not None else valkey.client().pipeline(transaction=False)
    if isinstance(n, int):
        target.hincrby(keys.metrics(family), field(*labels), n)
    else:
        target.hincrbyfloat(keys.metrics(family), field(*labels), n)
    if pipe is None:
        valkey.execute(target)


def add_many(family: str, counts: dict[tuple[str, ...], int]) -> None:
    """Several counts of one family in one round trip (nothing sent when all are zero)."""
    pipe = valkey.client().pipeline(transaction=False)
    for labels, n in counts.items():
        if n:
            pipe.hincrby(keys.metrics(family), field(*labels), n)
    if len(pipe):
        valkey.execute(pipe)


def read_all(families: tuple[str, ...]) -> dict[str, dict[tuple[str, ...], float]]:
    """Every family's fields, as label tuples → value, one round trip."""
    pipe = valkey.client().pipeline(transaction=False)
    for family in families:
        pipe.hgetall(keys.metrics(family))
    found: list[dict[str, Any]] = valkey.execute(pipe)
    return {
        family: {tuple(name.split("|")): float(value) for name, value in fields.items()}
        for family, fields in zip(families, found, strict=True)
    }
