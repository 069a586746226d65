"""The settings every role reads (the stores, the secret, routing, process logs), and those of
the two roles that start runs (web and worker): admission and a run's live state."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from redis.connection import parse_url

from lumastra.config import env
from tasks.schedule import time_zone


class WorkerMode(Enum):
    ENABLED = "enabled"  # this process may consume queues and run orchestrator loops
    DISABLED = "disabled"  # web role: may start runs, never consumes


def _parse_mode(raw: str) -> WorkerMode:
    return WorkerMode(raw.strip().lower())


_LOG_FORMAT = env.one_of("plain", "json")
_OTEL_MODE = env.one_of("console", "otlp", "off")


def _parse_otel(raw: str) -> str:
    # Empty: OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, else off (orchestrator.tracing).
    return _OTEL_MODE(raw) if raw.strip() else ""


# It begins every pub/sub channel name, so nothing that could read as a separator or pattern.
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _parse_namespace(raw: str) -> str:
    value = raw.strip()
    if value and not _NAMESPACE.fullmatch(value):
        raise ValueError(
            "expected up to 64 letters, digits, '.', '_' or '-', starting with a letter or "
            f"digit, got {raw!r}"
        )
    return value


def namespace_of(valkey_url: str) -> str:
    """The namespace a deployment gets when LUMASTRA_NAMESPACE is empty: `db<N>`, N the
    coordination Valkey's DB number. Deployments sharing a server each need their own DB
    anyway, so the DB tells them apart without anyone choosing a name."""
    try:
        db = parse_url(valkey_url).get("db") or 0  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise env.ConfigError(
            f"VALKEY_URL={valkey_url!r}: {exc}; LUMASTRA_NAMESPACE cannot be derived from it"
        ) from None
    return f"db{db}"


def _parse_time_zone(raw: str) -> str:
    value = raw.strip()
    time_zone(value)  # a ValueError names what is wrong
    return value


@dataclass(frozen=True)
class EveryRole:
    database_url: str = env.variable(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lumastra", str, "PostgreSQL"
    )
    valkey_url: str = env.variable(
        "VALKEY_URL", "redis://127.0.0.1:6379/0", str, "coordination Valkey (noeviction)"
    )
    valkey_cache_url: str = env.variable(
        "VALKEY_CACHE_URL", "redis://127.0.0.1:6379/1", str, "evictable cache Valkey"
    )
    celery_broker_url: str = env.variable(
        "CELERY_BROKER_URL", "redis://127.0.0.1:6379/2", str, "Celery broker"
    )
    # Empty only until `config.load` puts the derived value in (`namespace_of`).
    namespace: str = env.variable(
        "LUMASTRA_NAMESPACE",
        "",
        _parse_namespace,
        "prefix of this deployment's Valkey pub/sub channels; empty: db<N> of VALKEY_URL",
    )
    worker_mode: WorkerMode = env.variable(
        "LUMASTRA_WORKER_MODE",
        "enabled",
        _parse_mode,
        "enabled (worker role) or disabled (web role)",
    )
    per_task_queues: bool = env.variable(
        "LUMASTRA_PER_TASK_QUEUES",
        "true",
        env.parse_bool,
        "one queue per task; false: one per class",
    )
    secret_key: str = env.variable(
        "LUMASTRA_SECRET_KEY",
        "",
        str,
        "give every role the same long random value (e.g. python3 -c 'import secrets; "
        "print(secrets.token_urlsafe(50))')",
        required=True,
    )
    debug: bool = env.variable("LUMASTRA_DEBUG", "false", env.parse_bool, "Django DEBUG")
    task_modules: tuple[str, ...] = env.variable(
        "LUMASTRA_TASK_MODULES",
        "tasks.definitions.demo,tasks.definitions.catalog,tasks.definitions.catalog_media",
        env.parse_list,
        "comma-separated task definition modules the registry imports, after the built-in "
        "tasks.definitions.maintenance",
    )
    allow_volatile_valkey: bool = env.variable(
        "LUMASTRA_ALLOW_VOLATILE_VALKEY",
        "false",
        env.parse_bool,
        "start even if the coordination Valkey may evict keys or keeps nothing on disk",
    )
    log_format: str = env.variable(
        "LUMASTRA_LOG_FORMAT",
        "plain",
        _LOG_FORMAT,
        "process logs as plain lines or json (one object per line)",
    )
    otel: str = env.variable(
        "LUMASTRA_OTEL",
        "",
        _parse_otel,
        "traces: console (stdout), otlp, off; empty: otlp when OTEL_EXPORTER_OTLP_ENDPOINT "
        "is set, else off",
    )
    db_conn_max_age_s: int = env.variable(
        "LUMASTRA_DB_CONN_MAX_AGE_S", "600", int, "persistent DB connection lifetime"
    )
    store_timeout_s: int = env.variable(
        "LUMASTRA_STORE_TIMEOUT_S",
        "10",
        env.positive_int,
        "a Valkey or Postgres call that hears nothing back this long fails",
    )
    db_prepare_threshold: int = env.variable(
        "LUMASTRA_DB_PREPARE_THRESHOLD",
        "5",
        int,
        "uses on one connection before a run's statements are prepared; 0: never",
    )
    broker_visibility_timeout_s: int = env.variable(
        "LUMASTRA_BROKER_VISIBILITY_TIMEOUT_S",
        "3600",
        env.positive_int,
        "Redis transport redelivery",
    )
    time_zone: str = env.variable(
        "LUMASTRA_TIME_ZONE",
        "UTC",
        _parse_time_zone,
        "IANA zone of cron schedules that name none, and of the pages' local times",
    )
    health_timeout_s: int = env.variable(
        "LUMASTRA_HEALTH_TIMEOUT_S",
        "2",
        env.positive_int,
        "seconds /readyz and healthcheck --ready wait for each store",
    )
    cli_user: str = env.variable(
        "LUMASTRA_CLI_USER",
        "",
        str.strip,
        "the account `manage.py lumastra` acts as when no --as is given",
    )


@dataclass(frozen=True)
class Starters:
    run_active_ttl_s: int = env.variable(
        "LUMASTRA_RUN_ACTIVE_TTL_S",
        "900",
        env.positive_int,
        "live run hash TTL",
        roles=env.STARTERS,
    )
    run_terminal_ttl_s: int = env.variable(
        "LUMASTRA_RUN_TERMINAL_TTL_S",
        "3600",
        env.positive_int,
        "TTL of a terminal run snapshot",
        roles=env.STARTERS,
    )
    identity_ttl_s: int = env.variable(
        "LUMASTRA_IDENTITY_TTL_S",
        "86400",
        env.positive_int,
        "how long a run's identity key is held",
        roles=env.STARTERS,
    )
    identity_provisional_ttl_s: int = env.variable(
        "LUMASTRA_IDENTITY_PROVISIONAL_TTL_S",
        "30",
        env.positive_int,
        "identity hold before the run's insert commits",
        roles=env.STARTERS,
    )
    max_start_delay_s: int = env.variable(
        "LUMASTRA_MAX_START_DELAY_S",
        "2592000",
        env.positive_int,
        "the furthest ahead a delayed start may be",
        roles=env.STARTERS,
    )
    media_roots: tuple[Path, ...] = env.variable(
        "LUMASTRA_MEDIA_ROOTS",
        ".demo/media",
        env.parse_paths,
        "colon-separated folders file-reading tasks may read below",
        roles=env.STARTERS,
    )
    circuit_force_enable_ttl_s: float = env.variable(
        "LUMASTRA_CIRCUIT_FORCE_ENABLE_TTL_S",
        "86400",
        env.positive_seconds,
        "how long an operator's force-enable keeps a circuit admitting",
        roles=env.STARTERS,
    )
