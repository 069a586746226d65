"""The one typed view of the environment.

Every variable the system reads is declared here, once, with its default; `docs/environment.md`
lists the same names (a unit test keeps the two in step). Nothing else reads `os.environ`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import TypeVar

T = TypeVar("T")


class WorkerMode(Enum):
    ENABLED = "enabled"  # this process may consume queues and run orchestrator loops
    DISABLED = "disabled"  # web role: may start runs, never consumes


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str


# Per-class overrides are a family of variables; the docs list them by this pattern.
CLASS_PATTERNS = (
    EnvVar("LUMASTRA_CONCURRENCY_<CLASS>", "see RESOURCE_CLASSES", "worker processes of a pool"),
    EnvVar("LUMASTRA_QUEUE_DEPTH_CAP_<CLASS>", "see RESOURCE_CLASSES", "waiting messages cap"),
)

VARIABLES: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lumastra", "PostgreSQL"),
        EnvVar("VALKEY_URL", "redis://127.0.0.1:6379/0", "coordination Valkey (noeviction)"),
        EnvVar("VALKEY_CACHE_URL", "redis://127.0.0.1:6379/1", "evictable cache Valkey"),
        EnvVar("CELERY_BROKER_URL", "redis://127.0.0.1:6379/2", "Celery broker"),
        EnvVar("WORKER_MODE", "enabled", "enabled (worker role) or disabled (web role)"),
        EnvVar("FEATURE_PER_TASK_QUEUES", "true", "one queue per task; false: one per class"),
        EnvVar("LUMASTRA_SECRET_KEY", "dev-insecure-change-me", "Django SECRET_KEY"),
        EnvVar("LUMASTRA_DEBUG", "false", "Django DEBUG"),
        EnvVar("LUMASTRA_ALLOWED_HOSTS", "localhost,127.0.0.1", "comma-separated hosts"),
        EnvVar(
            "LUMASTRA_TASK_MODULES",
            "tasks.definitions.demo",
            "comma-separated task definition modules the registry imports",
        ),
        EnvVar("LUMASTRA_API_MAX_BODY_BYTES", "262144", "largest accepted API request body"),
        EnvVar("LUMASTRA_RUN_ACTIVE_TTL_S", "900", "TTL of a live run hash"),
        EnvVar("LUMASTRA_RUN_TERMINAL_TTL_S", "3600", "TTL of a terminal run snapshot"),
        EnvVar("LUMASTRA_LOG_CAP", "1000", "lines kept in a run's live log buffer"),
        EnvVar("LUMASTRA_HISTORY_RETENTION_DAYS", "30", "history-retention deletes older runs"),
        EnvVar("LUMASTRA_BROKER_VISIBILITY_TIMEOUT_S", "3600", "Redis transport redelivery"),
        EnvVar("LUMASTRA_DB_CONN_MAX_AGE_S", "600", "persistent DB connection lifetime"),
    )
}


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


def _parse_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


class ConfigError(ValueError):
    """A variable holds a value the system cannot use."""


@dataclass(frozen=True)
class Config:
    database_url: str
    valkey_url: str
    valkey_cache_url: str
    celery_broker_url: str
    worker_mode: WorkerMode
    per_task_queues: bool
    secret_key: str
    debug: bool
    allowed_hosts: tuple[str, ...]
    task_modules: tuple[str, ...]
    api_max_body_bytes: int
    run_active_ttl_s: int
    run_terminal_ttl_s: int
    log_cap: int
    history_retention_days: int
    broker_visibility_timeout_s: int
    db_conn_max_age_s: int
    concurrency_overrides: Mapping[str, int]
    queue_depth_cap_overrides: Mapping[str, int]


def load(environ: Mapping[str, str]) -> Config:
    def get(name: str, parse: Callable[[str], T]) -> T:
        raw = environ.get(name, VARIABLES[name].default)
        try:
            return parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{name}={raw!r}: {exc}") from None

    def per_class(prefix: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for key, raw in environ.items():
            if key.startswith(prefix):
                try:
                    found[key.removeprefix(prefix).lower()] = int(raw)
                except ValueError:
                    raise ConfigError(f"{key}={raw!r}: expected an integer") from None
        return found

    return Config(
        database_url=get("DATABASE_URL", str),
        valkey_url=get("VALKEY_URL", str),
        valkey_cache_url=get("VALKEY_CACHE_URL", str),
        celery_broker_url=get("CELERY_BROKER_URL", str),
        worker_mode=get("WORKER_MODE", lambda raw: WorkerMode(raw.strip().lower())),
        per_task_queues=get("FEATURE_PER_TASK_QUEUES", _parse_bool),
        secret_key=get("LUMASTRA_SECRET_KEY", str),
        debug=get("LUMASTRA_DEBUG", _parse_bool),
        allowed_hosts=get("LUMASTRA_ALLOWED_HOSTS", _parse_list),
        task_modules=get("LUMASTRA_TASK_MODULES", _parse_list),
        api_max_body_bytes=get("LUMASTRA_API_MAX_BODY_BYTES", int),
        run_active_ttl_s=get("LUMASTRA_RUN_ACTIVE_TTL_S", int),
        run_terminal_ttl_s=get("LUMASTRA_RUN_TERMINAL_TTL_S", int),
        log_cap=get("LUMASTRA_LOG_CAP", int),
        history_retention_days=get("LUMASTRA_HISTORY_RETENTION_DAYS", int),
        broker_visibility_timeout_s=get("LUMASTRA_BROKER_VISIBILITY_TIMEOUT_S", int),
        db_conn_max_age_s=get("LUMASTRA_DB_CONN_MAX_AGE_S", int),
        concurrency_overrides=per_class("LUMASTRA_CONCURRENCY_"),
        queue_depth_cap_overrides=per_class("LUMASTRA_QUEUE_DEPTH_CAP_"),
    )


@cache
def current() -> Config:
    """The process's configuration, read once from its environment."""
    return load(os.environ)
