"""The one typed view of the environment.

Every variable the system reads is declared here, once, with its default; `docs/environment.md`
lists the same names (a unit test keeps the two in step). The roles read the settings built
from this; only process plumbing reads `os.environ` itself (the role scripts, the pool
settings a worker hands its children, a command's marks).

A renamed variable keeps its old name for one release (`Renamed`): set alone, the old name is
read (converted to the new unit) with a `FutureWarning` naming the new one; set with the new
one, the new one wins.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

# The project directory: relative media roots are taken from it (the demo's default is one).
_PROJECT_DIR = Path(__file__).resolve().parents[1]


class WorkerMode(Enum):
    ENABLED = "enabled"  # this process may consume queues and run orchestrator loops
    DISABLED = "disabled"  # web role: may start runs, never consumes


@dataclass(frozen=True)
class Renamed:
    """A variable's name before this release, and what one of its units is in the new one."""

    old: str
    scale: float = 1.0  # 0.001: the old name was in milliseconds, the new one in seconds

    def value(self, raw: str) -> str:
        if self.scale == 1.0:
            return raw
        try:
            value = float(raw) * self.scale
        except ValueError:
            return raw  # refused by the new variable's parser, with the old name in the error
        # Whole seconds as an integer (an integer variable's parser takes no "2.592e+06").
        return str(int(value)) if value.is_integer() else repr(value)


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str
    renamed: Renamed | None = None


# Per-class overrides are a family of variables; the docs list them by this pattern.
CLASS_PATTERNS = (
    EnvVar("LUMASTRA_CONCURRENCY_<CLASS>", "see RESOURCE_CLASSES", "worker processes of a pool"),
    EnvVar("LUMASTRA_QUEUE_DEPTH_CAP_<CLASS>", "see RESOURCE_CLASSES", "waiting messages cap"),
    EnvVar("LUMASTRA_HARD_TIMEOUT_S_<CLASS>", "see RESOURCE_CLASSES", "default hard timeout"),
    EnvVar("LUMASTRA_STALL_FAIL_S_<CLASS>", "see RESOURCE_CLASSES", "default stall limit"),
)


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


def _parse_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _parse_paths(raw: str) -> tuple[Path, ...]:
    # Colon-separated like PATH: a comma is more likely than a colon in a media folder's name.
    parts = (part.strip() for part in raw.split(":"))
    return tuple(Path(os.path.normpath(_PROJECT_DIR / part)) for part in parts if part)


def _parse_path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("expected a folder, got nothing")
    return Path(os.path.normpath(_PROJECT_DIR / raw.strip()))


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"must be at least 0, got {value}")
    return value


def _parse_level(raw: str) -> str:
    level = raw.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got {raw!r}")
    return level


def _parse_log_format(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("plain", "json"):
        raise ValueError(f"expected plain or json, got {raw!r}")
    return value


def _parse_mode(raw: str) -> WorkerMode:
    return WorkerMode(raw.strip().lower())


def _positive_seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"expected seconds above 0, got {raw!r}")
    return value


def _non_negative_seconds(raw: str) -> float:
    value = float(raw)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"expected seconds, 0 or more, got {raw!r}")
    return value


def _env(
    name: str,
    default: str,
    parse: Callable[[str], Any],
    help: str,
    renamed: Renamed | None = None,
) -> Any:
    """A Config field read from variable `name`; its metadata is the documentation."""
    return field(metadata={"var": EnvVar(name, default, help, renamed), "parse": parse})


class ConfigError(ValueError):
    """A variable holds a value the system cannot use."""


@dataclass(frozen=True)
class Config:
    database_url: str = _env(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lumastra", str, "PostgreSQL"
    )
    valkey_url: str = _env(
        "VALKEY_URL", "redis://127.0.0.1:6379/0", str, "coordination Valkey (noeviction)"
    )
    valkey_cache_url: str = _env(
        "VALKEY_CACHE_URL", "redis://127.0.0.1:6379/1", str, "evictable cache Valkey"
    )
    celery_broker_url: str = _env(
        "CELERY_BROKER_URL", "redis://127.0.0.1:6379/2", str, "Celery broker"
    )
    worker_mode: WorkerMode = _env(
        "LUMASTRA_WORKER_MODE",
        "enabled",
        _parse_mode,
        "enabled (worker role) or disabled (web role)",
        Renamed("WORKER_MODE"),
    )
    per_task_queues: bool = _env(
        "LUMASTRA_PER_TASK_QUEUES",
        "true",
        _parse_bool,
        "one queue per task; false: one per class",
        Renamed("FEATURE_PER_TASK_QUEUES"),
    )
    secret_key: str = _env(
        "LUMASTRA_SECRET_KEY", "", str, "SECRET_KEY; the role scripts refuse to start without it"
    )
    debug: bool = _env("LUMASTRA_DEBUG", "false", _parse_bool, "Django DEBUG")
    allowed_hosts: tuple[str, ...] = _env(
        "LUMASTRA_ALLOWED_HOSTS", "localhost,127.0.0.1", _parse_list, "comma-separated hosts"
    )
    csrf_trusted_origins: tuple[str, ...] = _env(
        "LUMASTRA_CSRF_TRUSTED_ORIGINS", "", _parse_list, "origins trusted for unsafe requests"
    )
    https: bool = _env(
        "LUMASTRA_HTTPS", "false", _parse_bool, "served over HTTPS: secure cookies, redirect"
    )
    proxy_ssl_header: bool = _env(
        "LUMASTRA_PROXY_SSL_HEADER",
        "false",
        _parse_bool,
        "trust X-Forwarded-Proto from the TLS-terminating proxy",
    )
    hsts_seconds: int = _env(
        "LUMASTRA_HSTS_SECONDS", "0", _non_negative_int, "Strict-Transport-Security max-age"
    )
    hsts_include_subdomains: bool = _env(
        "LUMASTRA_HSTS_INCLUDE_SUBDOMAINS", "false", _parse_bool, "HSTS includeSubDomains"
    )
    hsts_preload: bool = _env("LUMASTRA_HSTS_PRELOAD", "false", _parse_bool, "HSTS preload")
    task_modules: tuple[str, ...] = _env(
        "LUMASTRA_TASK_MODULES",
        "tasks.definitions.demo,tasks.definitions.catalog,tasks.definitions.catalog_media",
        _parse_list,
        "comma-separated task definition modules the registry imports, after the built-in "
        "tasks.definitions.maintenance",
    )
    web_host: str = _env("LUMASTRA_WEB_HOST", "127.0.0.1", str, "address the web role binds")
    web_port: int = _env("LUMASTRA_WEB_PORT", "8000", _positive_int, "port the web role serves on")
    api_max_body_bytes: int = _env(
        "LUMASTRA_API_MAX_BODY_BYTES", "262144", _positive_int, "largest accepted API request body"
    )
    auth_failure_limit: int = _env(
        "LUMASTRA_AUTH_FAILURE_LIMIT",
        "10",
        _positive_int,
        "failed sign-ins (API token or admin login) per client address per window",
    )
    auth_failure_window_s: int = _env(
        "LUMASTRA_AUTH_FAILURE_WINDOW_S",
        "300",
        _positive_int,
        "seconds from an address's first failed sign-in in which its failures are counted",
    )
    web_read_timeout_s: int = _env(
        "LUMASTRA_WEB_READ_TIMEOUT_S",
        "15",
        _positive_int,
        "seconds a client has to send a request's headers, and again its body",
    )
    web_keep_alive_s: int = _env(
        "LUMASTRA_WEB_KEEP_ALIVE_S", "5", _positive_int, "idle keep-alive connection lifetime"
    )
    web_limit_concurrency: int = _env(
        "LUMASTRA_WEB_LIMIT_CONCURRENCY",
        "1000",
        _positive_int,
        "connections or requests at once before the web role answers 503",
    )
    web_max_header_bytes: int = _env(
        "LUMASTRA_WEB_MAX_HEADER_BYTES", "32768", _positive_int, "largest request head"
    )
    # Flower's own name, which Flower also reads itself (like CELERY_BROKER_URL, Celery's).
    flower_basic_auth: tuple[str, ...] = _env(
        "FLOWER_BASIC_AUTH", "", _parse_list, "Flower's user:password pairs, comma-separated"
    )
    flower_url: str = _env(
        "LUMASTRA_FLOWER_URL", "http://127.0.0.1:5555", str, "where operators reach Flower"
    )
    run_active_ttl_s: int = _env(
        "LUMASTRA_RUN_ACTIVE_TTL_S", "900", _positive_int, "live run hash TTL"
    )
    run_terminal_ttl_s: int = _env(
        "LUMASTRA_RUN_TERMINAL_TTL_S", "3600", _positive_int, "TTL of a terminal run snapshot"
    )
    log_cap: int = _env("LUMASTRA_LOG_CAP", "1000", _positive_int, "lines kept in a run's live log")
    log_flush_lines: int = _env(
        "LUMASTRA_LOG_FLUSH_LINES", "100", _positive_int, "log lines a run sends in one batch"
    )
    log_flush_s: float = _env(
        "LUMASTRA_LOG_FLUSH_S",
        "0.25",
        _positive_seconds,
        "a run's waiting log lines are sent at its next line once the oldest is this old",
        Renamed("LUMASTRA_LOG_FLUSH_MS", scale=0.001),
    )
    run_log_tail: int = _env(
        "LUMASTRA_RUN_LOG_TAIL",
        "200",
        _non_negative_int,
        "last log lines of an attempt kept on its run's row",
    )
    run_log_level: str = _env(
        "LUMASTRA_RUN_LOG_LEVEL",
        "INFO",
        _parse_level,
        "lowest level of a handler's logging records copied to its run's log",
    )
    progress_write_s: float = _env(
        "LUMASTRA_PROGRESS_WRITE_S",
        "0.25",
        _positive_seconds,
        "a run's progress reaches its live hash at most this often",
        Renamed("LUMASTRA_PROGRESS_WRITE_MS", scale=0.001),
    )
    progress_force_s: int = _env(
        "LUMASTRA_PROGRESS_FORCE_S",
        "30",
        _positive_int,
        "a run's changing progress reaches its row at least this often",
    )
    log_format: str = _env(
        "LUMASTRA_LOG_FORMAT",
        "plain",
        _parse_log_format,
        "process logs as plain lines or json (one object per line)",
    )
    webhook_interval_s: int = _env(
        "LUMASTRA_WEBHOOK_INTERVAL_S", "2", _positive_int, "seconds between webhook loop passes"
    )
    webhook_max_attempts: int = _env(
        "LUMASTRA_WEBHOOK_MAX_ATTEMPTS",
        "8",
        _positive_int,
        "failed sends of a webhook delivery before it is dead",
    )
    webhook_allow_private: bool = _env(
        "LUMASTRA_WEBHOOK_ALLOW_PRIVATE",
        "false",
        _parse_bool,
        "allow webhook endpoints on loopback, private and link-local addresses",
    )
    webhook_timeout_s: int = _env(
        "LUMASTRA_WEBHOOK_TIMEOUT_S",
        "10",
        _positive_int,
        "seconds a webhook endpoint has to answer",
    )
    health_timeout_s: int = _env(
        "LUMASTRA_HEALTH_TIMEOUT_S",
        "2",
        _positive_int,
        "seconds /readyz and healthcheck --ready wait for each store",
    )
    metrics_token: str = _env(
        "LUMASTRA_METRICS_TOKEN",
        "",
        str,
        "bearer token /metrics asks for; unset: /metrics is disabled",
    )
    sse_keepalive_s: int = _env(
        "LUMASTRA_SSE_KEEPALIVE_S",
        "15",
        _positive_int,
        "seconds between keep-alive comments on an idle event stream",
    )
    media_roots: tuple[Path, ...] = _env(
        "LUMASTRA_MEDIA_ROOTS",
        ".demo/media",
        _parse_paths,
        "colon-separated folders file-reading tasks may read below",
    )
    trickplay_root: Path = _env(
        "LUMASTRA_TRICKPLAY_ROOT",
        ".demo/trickplay",
        _parse_path,
        "folder the demo's trickplay stage writes its sprites and WebVTT indexes below",
    )
    history_retention_s: int = _env(
        "LUMASTRA_HISTORY_RETENTION_S",
        "2592000",
        _positive_int,
        "history-retention deletes older runs",
        Renamed("LUMASTRA_HISTORY_RETENTION_DAYS", scale=86400),
    )
    webhook_retention_s: int = _env(
        "LUMASTRA_WEBHOOK_RETENTION_S",
        "1209600",
        _positive_int,
        "history-retention deletes older delivered or dead webhook deliveries",
        Renamed("LUMASTRA_WEBHOOK_RETENTION_DAYS", scale=86400),
    )
    coverage_outbox_retention_s: int = _env(
        "LUMASTRA_COVERAGE_OUTBOX_RETENTION_S",
        "2592000",
        _positive_int,
        "history-retention deletes outbox events dead-lettered longer ago",
        Renamed("LUMASTRA_COVERAGE_OUTBOX_RETENTION_DAYS", scale=86400),
    )
    retention_batch: int = _env(
        "LUMASTRA_RETENTION_BATCH",
        "1000",
        _positive_int,
        "rows one history-retention batch (one short transaction) deletes at most",
    )
    broker_visibility_timeout_s: int = _env(
        "LUMASTRA_BROKER_VISIBILITY_TIMEOUT_S", "3600", _positive_int, "Redis transport redelivery"
    )
    db_conn_max_age_s: int = _env(
        "LUMASTRA_DB_CONN_MAX_AGE_S", "600", int, "persistent DB connection lifetime"
    )
    store_timeout_s: int = _env(
        "LUMASTRA_STORE_TIMEOUT_S",
        "10",
        _positive_int,
        "a Valkey or Postgres call that hears nothing back this long fails",
    )
    db_prepare_threshold: int = _env(
        "LUMASTRA_DB_PREPARE_THRESHOLD",
        "5",
        int,
        "uses on one connection before a run's statements are prepared; 0: never",
    )
    identity_ttl_s: int = _env(
        "LUMASTRA_IDENTITY_TTL_S", "86400", _positive_int, "how long a run's identity key is held"
    )
    identity_provisional_ttl_s: int = _env(
        "LUMASTRA_IDENTITY_PROVISIONAL_TTL_S",
        "30",
        _positive_int,
        "identity hold before the run's insert commits",
    )
    circuit_failure_threshold: int = _env(
        "LUMASTRA_CIRCUIT_FAILURE_THRESHOLD",
        "5",
        _positive_int,
        "consecutive counted failures that open a task's circuit",
    )
    circuit_force_enable_ttl_s: float = _env(
        "LUMASTRA_CIRCUIT_FORCE_ENABLE_TTL_S",
        "86400",
        _positive_seconds,
        "how long an operator's force-enable keeps a circuit admitting",
        Renamed("LUMASTRA_CIRCUIT_FORCE_ENABLE_TTL_MS", scale=0.001),
    )
    heartbeat_interval_s: int = _env(
        "LUMASTRA_HEARTBEAT_INTERVAL_S", "30", _positive_int, "a running run's heartbeat tick"
    )
    cancel_escalate_s: int = _env(
        "LUMASTRA_CANCEL_ESCALATE_S", "60", _positive_int, "cooperative cancel before hard kill"
    )
    max_deliveries: int = _env(
        "LUMASTRA_MAX_DELIVERIES", "5", _positive_int, "deliveries of one run's message"
    )
    shutdown_grace_s: int = _env(
        "LUMASTRA_SHUTDOWN_GRACE_S",
        "30",
        _positive_int,
        "seconds a stopping worker gives its running runs before handing them back",
    )
    orphan_threshold_s: int = _env(
        "LUMASTRA_ORPHAN_THRESHOLD_S", "300", _positive_int, "heartbeat age that makes an orphan"
    )
    orphan_boot_threshold_s: int = _env(
        "LUMASTRA_ORPHAN_BOOT_THRESHOLD_S",
        "120",
        _positive_int,
        "heartbeat age that makes an orphan at boot recovery",
    )
    pending_check_after_s: int = _env(
        "LUMASTRA_PENDING_CHECK_AFTER_S",
        "60",
        _positive_int,
        "pending this long: check the broker for its message",
    )
    pending_deadline_s: int = _env(
        "LUMASTRA_PENDING_DEADLINE_S", "86400", _positive_int, "pending this long: fail the run"
    )
    pipeline_recover_after_s: int = _env(
        "LUMASTRA_PIPELINE_RECOVER_AFTER_S",
        "30",
        _positive_int,
        "a pipeline run between stages unmoved this long is checked by the reconciler",
    )
    reconcile_interval_s: int = _env(
        "LUMASTRA_RECONCILE_INTERVAL_S", "30", _positive_int, "seconds between reconciler ticks"
    )
    drain_interval_s: int = _env(
        "LUMASTRA_DRAIN_INTERVAL_S", "5", _positive_int, "seconds between drain replays"
    )
    quota_rollup_interval_s: int = _env(
        "LUMASTRA_QUOTA_ROLLUP_INTERVAL_S",
        "30",
        _positive_int,
        "seconds between roll-ups of uncapped tasks' daily counts into task_quota_usage",
    )
    scheduler_tick_s: int = _env(
        "LUMASTRA_SCHEDULER_TICK_S",
        "10",
        _positive_int,
        "seconds between scheduler ticks (dynamic schedules)",
    )
    leader_ttl_s: int = _env(
        "LUMASTRA_LEADER_TTL_S", "15", _positive_int, "lease of the leader lock lock:orch:cluster"
    )
    leader_renew_s: int = _env(
        "LUMASTRA_LEADER_RENEW_S", "5", _positive_int, "seconds between a leader's renewals"
    )
    leader_jitter_s: float = _env(
        "LUMASTRA_LEADER_JITTER_S",
        "1",
        _non_negative_seconds,
        "most random delay added to each attempt to take a leader lock",
        Renamed("LUMASTRA_LEADER_JITTER_MS", scale=0.001),
    )
    worker_max_tasks_per_child: int = _env(
        "LUMASTRA_WORKER_MAX_TASKS_PER_CHILD",
        "0",
        _non_negative_int,
        "runs before a child is recycled (0: never, only by memory)",
    )
    worker_max_memory_per_child_kb: int = _env(
        "LUMASTRA_WORKER_MAX_MEMORY_PER_CHILD_KB",
        "1048576",
        _positive_int,
        "resident KiB after which a child is recycled",
    )
    stage_result_max_bytes: int = _env(
        "LUMASTRA_STAGE_RESULT_MAX_BYTES",
        "65536",
        _positive_int,
        "largest JSON result a pipeline stage may return",
    )
    coverage_authoritative_stages: tuple[str, ...] = _env(
        "LUMASTRA_COVERAGE_AUTHORITATIVE_STAGES",
        "*",
        _parse_list,
        "comma-separated covered stages the stage-sweep starts runs for; * for every one",
        Renamed("PIPELINE_COVERAGE_AUTHORITATIVE_STAGES"),
    )
    coverage_sweep_interval_s: int = _env(
        "LUMASTRA_COVERAGE_SWEEP_INTERVAL_S", "60", _positive_int, "seconds between sweep ticks"
    )
    coverage_seed_per_tick: int = _env(
        "LUMASTRA_COVERAGE_SEED_PER_TICK",
        "50",
        _non_negative_int,
        "items with no row a sweep tick gives rows to, per stage (new items get theirs by event)",
    )
    coverage_heal_per_tick: int = _env(
        "LUMASTRA_COVERAGE_HEAL_PER_TICK",
        "2000",
        _non_negative_int,
        "skipped rows a sweep tick checks again, per stage",
    )
    coverage_starts_per_stage: int = _env(
        "LUMASTRA_COVERAGE_STARTS_PER_STAGE",
        "100",
        _non_negative_int,
        "runs a sweep tick starts at most per stage",
    )
    coverage_starts_per_tick: int = _env(
        "LUMASTRA_COVERAGE_STARTS_PER_TICK",
        "500",
        _non_negative_int,
        "runs a sweep tick starts at most, all stages together",
    )
    coverage_class_depth_threshold: int = _env(
        "LUMASTRA_COVERAGE_CLASS_DEPTH_THRESHOLD",
        "500",
        _positive_int,
        "waiting messages in a class's queues above which the sweep skips its stages for a tick",
    )
    coverage_season_settle_s: int = _env(
        "LUMASTRA_COVERAGE_SEASON_SETTLE_S",
        "1800",
        _non_negative_int,
        "seconds a season must go without an episode added or removed before its stages run",
    )
    coverage_wedged_after_s: int = _env(
        "LUMASTRA_COVERAGE_WEDGED_AFTER_S",
        "600",
        _positive_int,
        "seconds a row may be running with its run no longer live before it is reclaimed",
    )
    coverage_dispatch_interval_s: int = _env(
        "LUMASTRA_COVERAGE_DISPATCH_INTERVAL_S",
        "30",
        _positive_int,
        "seconds between outbox dispatcher passes",
    )
    coverage_dispatch_batch: int = _env(
        "LUMASTRA_COVERAGE_DISPATCH_BATCH",
        "500",
        _positive_int,
        "outbox events one dispatcher transaction takes",
    )
    coverage_dispatch_max_attempts: int = _env(
        "LUMASTRA_COVERAGE_DISPATCH_MAX_ATTEMPTS",
        "8",
        _positive_int,
        "failed dispatches of an outbox event before it is dead-lettered",
    )
    concurrency_overrides: Mapping[str, int] = field(default_factory=dict)
    queue_depth_cap_overrides: Mapping[str, int] = field(default_factory=dict)
    hard_timeout_overrides: Mapping[str, int] = field(default_factory=dict)
    stall_fail_overrides: Mapping[str, int] = field(default_factory=dict)


VARIABLES: dict[str, EnvVar] = {
    f.metadata["var"].name: f.metadata["var"] for f in fields(Config) if "var" in f.metadata
}


def load(environ: Mapping[str, str]) -> Config:
    values: dict[str, Any] = {}
    for f in fields(Config):
        if "var" not in f.metadata:
            continue
        var: EnvVar = f.metadata["var"]
        name, raw = var.name, environ.get(var.name)
        if raw is None and var.renamed is not None and var.renamed.old in environ:
            name, raw = var.renamed.old, var.renamed.value(environ[var.renamed.old])
            warnings.warn(
                f"{name} is renamed {var.name}: read as {var.name}={raw} this release, "
                f"set {var.name} instead",
                FutureWarning,
                stacklevel=2,
            )
        if raw is None:
            raw = var.default
        try:
            values[f.name] = f.metadata["parse"](raw)
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
                if int(raw) < 1:
                    raise ConfigError(f"{key}={raw!r}: must be at least 1")
        return found

    return Config(
        **values,
        concurrency_overrides=per_class("LUMASTRA_CONCURRENCY_"),
        queue_depth_cap_overrides=per_class("LUMASTRA_QUEUE_DEPTH_CAP_"),
        hard_timeout_overrides=per_class("LUMASTRA_HARD_TIMEOUT_S_"),
        stall_fail_overrides=per_class("LUMASTRA_STALL_FAIL_S_"),
    )


@cache
def current() -> Config:
    """The process's configuration, read once from its environment."""
    return load(os.environ)
