"""The catalog's settings: the stage-sweep, the outbox dispatcher and the outbox's retention.

Declared like the engine's (`lumastra.config.env`), read once per process into Django's
`settings.COVERAGE` (`lumastra/settings.py`), and listed in `docs/environment.md` under the
worker role, whose loops process runs the sweep and the dispatcher on the cluster leader.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from lumastra.config import env
from lumastra.config.env import EnvVar


@dataclass(frozen=True)
class CoverageConfig:
    outbox_retention_s: int = env.variable(
        "LUMASTRA_COVERAGE_OUTBOX_RETENTION_S",
        "2592000",
        env.positive_int,
        "history-retention deletes outbox events dead-lettered longer ago",
        roles=env.WORKER,
    )
    authoritative_stages: tuple[str, ...] = env.variable(
        "LUMASTRA_COVERAGE_AUTHORITATIVE_STAGES",
        "*",
        env.parse_list,
        "comma-separated covered stages the stage-sweep starts runs for; * for every one",
        roles=env.WORKER,
    )
    watch: bool = env.variable(
        "LUMASTRA_WATCH",
        "true",
        env.parse_bool,
        "the worker role runs the file watcher over LUMASTRA_MEDIA_ROOTS",
        roles=env.WORKER,
    )
    watch_delay_s: float = env.variable(
        "LUMASTRA_WATCH_DELAY_S",
        "60",
        env.positive_seconds,
        "a folder with changes is synced once quiet this long",
        roles=env.WORKER,
    )
    watch_rescan_s: int = env.variable(
        "LUMASTRA_WATCH_RESCAN_S",
        "3600",
        env.positive_int,
        "seconds between the watcher's reconcile scans of its roots",
        roles=env.WORKER,
    )
    sweep_interval_s: int = env.variable(
        "LUMASTRA_COVERAGE_SWEEP_INTERVAL_S",
        "60",
        env.positive_int,
        "seconds between sweep ticks",
        roles=env.WORKER,
    )
    seed_per_tick: int = env.variable(
        "LUMASTRA_COVERAGE_SEED_PER_TICK",
        "50",
        env.non_negative_int,
        "items with no row a sweep tick gives rows to, per stage (new items get theirs by event)",
        roles=env.WORKER,
    )
    heal_per_tick: int = env.variable(
        "LUMASTRA_COVERAGE_HEAL_PER_TICK",
        "2000",
        env.non_negative_int,
        "skipped rows a sweep tick checks again, per stage",
        roles=env.WORKER,
    )
    starts_per_stage: int = env.variable(
        "LUMASTRA_COVERAGE_STARTS_PER_STAGE",
        "100",
        env.non_negative_int,
        "runs a sweep tick starts at most per stage",
        roles=env.WORKER,
    )
    starts_per_tick: int = env.variable(
        "LUMASTRA_COVERAGE_STARTS_PER_TICK",
        "500",
        env.non_negative_int,
        "runs a sweep tick starts at most, all stages together",
        roles=env.WORKER,
    )
    class_depth_threshold: int = env.variable(
        "LUMASTRA_COVERAGE_CLASS_DEPTH_THRESHOLD",
        "500",
        env.positive_int,
        "waiting messages in a class's queues above which the sweep skips its stages for a tick",
        roles=env.WORKER,
    )
    season_settle_s: int = env.variable(
        "LUMASTRA_COVERAGE_SEASON_SETTLE_S",
        "1800",
        env.non_negative_int,
        "seconds a season must go without an episode added or removed before its stages run",
        roles=env.WORKER,
    )
    wedged_after_s: int = env.variable(
        "LUMASTRA_COVERAGE_WEDGED_AFTER_S",
        "600",
        env.positive_int,
        "seconds a row may be running with its run no longer live before it is reclaimed",
        roles=env.WORKER,
    )
    dispatch_interval_s: int = env.variable(
        "LUMASTRA_COVERAGE_DISPATCH_INTERVAL_S",
        "30",
        env.positive_int,
        "seconds between outbox dispatcher passes",
        roles=env.WORKER,
    )
    dispatch_batch: int = env.variable(
        "LUMASTRA_COVERAGE_DISPATCH_BATCH",
        "500",
        env.positive_int,
        "outbox events one dispatcher transaction takes",
        roles=env.WORKER,
    )
    dispatch_max_attempts: int = env.variable(
        "LUMASTRA_COVERAGE_DISPATCH_MAX_ATTEMPTS",
        "8",
        env.positive_int,
        "failed dispatches of an outbox event before it is dead-lettered",
        roles=env.WORKER,
    )


VARIABLES: dict[str, EnvVar] = env.declared(CoverageConfig)


def load(environ: Mapping[str, str]) -> CoverageConfig:
    return env.read(CoverageConfig, environ)


@cache
def current() -> CoverageConfig:
    """The process's catalog settings, read once from its environment."""
    return load(os.environ)
