"""The worker role's settings: running runs (logs, progress, heartbeats, cancels, pool children)
and the loops that recover, schedule, send webhooks and notifications and clean up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lumastra.config import env

_LEVEL = env.one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", upper=True)


@dataclass(frozen=True)
class Worker:
    log_cap: int = env.variable(
        "LUMASTRA_LOG_CAP",
        "1000",
        env.positive_int,
        "lines kept in a run's live log",
        roles=env.WORKER,
    )
    log_flush_lines: int = env.variable(
        "LUMASTRA_LOG_FLUSH_LINES",
        "100",
        env.positive_int,
        "log lines a run sends in one batch",
        roles=env.WORKER,
    )
    log_flush_s: float = env.variable(
        "LUMASTRA_LOG_FLUSH_S",
        "0.25",
        env.positive_seconds,
        "a run's waiting log lines are sent at its next line once the oldest is this old",
        roles=env.WORKER,
    )
    run_log_tail: int = env.variable(
        "LUMASTRA_RUN_LOG_TAIL",
        "200",
        env.non_negative_int,
        "last log lines of an attempt kept on its run's row",
        roles=env.WORKER,
    )
    run_log_level: str = env.variable(
        "LUMASTRA_RUN_LOG_LEVEL",
        "INFO",
        _LEVEL,
        "lowest level of a handler's logging records copied to its run's log",
        roles=env.WORKER,
    )
    progress_write_s: float = env.variable(
        "LUMASTRA_PROGRESS_WRITE_S",
        "0.25",
        env.positive_seconds,
        "a run's progress reaches its live hash at most this often",
        roles=env.WORKER,
    )
    progress_force_s: int = env.variable(
        "LUMASTRA_PROGRESS_FORCE_S",
        "30",
        env.positive_int,
        "a run's changing progress reaches its row at least this often",
        roles=env.WORKER,
    )
    webhook_interval_s: int = env.variable(
        "LUMASTRA_WEBHOOK_INTERVAL_S",
        "2",
        env.positive_int,
        "seconds between webhook loop passes",
        roles=env.WORKER,
    )
    webhook_max_attempts: int = env.variable(
        "LUMASTRA_WEBHOOK_MAX_ATTEMPTS",
        "8",
        env.positive_int,
        "failed sends of a webhook delivery before it is dead",
        roles=env.WORKER,
    )
    webhook_allow_private: bool = env.variable(
        "LUMASTRA_WEBHOOK_ALLOW_PRIVATE",
        "false",
        env.parse_bool,
        "allow webhook endpoints on loopback, private and link-local addresses",
        roles=env.WORKER,
    )
    webhook_timeout_s: int = env.variable(
        "LUMASTRA_WEBHOOK_TIMEOUT_S",
        "10",
        env.positive_int,
        "seconds a webhook endpoint has to answer",
        roles=env.WORKER,
    )
    notify_urls: tuple[str, ...] = env.variable(
        "LUMASTRA_NOTIFY_URLS",
        "",
        env.parse_words,
        "Apprise URLs operators' notifications go to, space-separated; "
        "`kind,kind=URL` sends only those kinds there",
        roles=env.WORKER,
    )
    notify_interval_s: int = env.variable(
        "LUMASTRA_NOTIFY_INTERVAL_S",
        "5",
        env.positive_int,
        "seconds between notification loop passes",
        roles=env.WORKER,
    )
    notify_max_per_hour: int = env.variable(
        "LUMASTRA_NOTIFY_MAX_PER_HOUR",
        "20",
        env.positive_int,
        "messages of one kind sent in an hour; past it they wait and go as one digest",
        roles=env.WORKER,
    )
    notify_max_attempts: int = env.variable(
        "LUMASTRA_NOTIFY_MAX_ATTEMPTS",
        "10",
        env.positive_int,
        "failed sends of a notification before it is dead",
        roles=env.WORKER,
    )
    console_url: str = env.variable(
        "LUMASTRA_CONSOLE_URL",
        "http://localhost:8000",
        env.parse_url,
        "where operators reach the console: notifications link to its pages",
        roles=env.WORKER,
    )
    trickplay_root: Path = env.variable(
        "LUMASTRA_TRICKPLAY_ROOT",
        ".demo/trickplay",
        env.parse_path,
        "folder the demo's trickplay stage writes its sprites and WebVTT indexes below",
        roles=env.STARTERS,
    )
    history_retention_s: int = env.variable(
        "LUMASTRA_HISTORY_RETENTION_S",
        "2592000",
        env.positive_int,
        "history-retention deletes older runs",
        roles=env.WORKER,
    )
    webhook_retention_s: int = env.variable(
        "LUMASTRA_WEBHOOK_RETENTION_S",
        "1209600",
        env.positive_int,
        "history-retention deletes older delivered or dead webhook deliveries",
        roles=env.WORKER,
    )
    retention_batch: int = env.variable(
        "LUMASTRA_RETENTION_BATCH",
        "1000",
        env.positive_int,
        "rows one history-retention batch (one short transaction) deletes at most",
        roles=env.WORKER,
    )
    circuit_failure_threshold: int = env.variable(
        "LUMASTRA_CIRCUIT_FAILURE_THRESHOLD",
        "5",
        env.positive_int,
        "consecutive counted failures that open a task's circuit",
        roles=env.WORKER,
    )
    heartbeat_interval_s: int = env.variable(
        "LUMASTRA_HEARTBEAT_INTERVAL_S",
        "30",
        env.positive_int,
        "a running run's heartbeat tick",
        roles=env.WORKER,
    )
    cancel_escalate_s: int = env.variable(
        "LUMASTRA_CANCEL_ESCALATE_S",
        "60",
        env.positive_int,
        "cooperative cancel before hard kill",
        roles=env.WORKER,
    )
    max_deliveries: int = env.variable(
        "LUMASTRA_MAX_DELIVERIES",
        "5",
        env.positive_int,
        "deliveries of one run's message",
        roles=env.WORKER,
    )
    shutdown_grace_s: int = env.variable(
        "LUMASTRA_SHUTDOWN_GRACE_S",
        "30",
        env.positive_int,
        "seconds a stopping worker gives its running runs before handing them back",
        roles=env.WORKER,
    )
    orphan_threshold_s: int = env.variable(
        "LUMASTRA_ORPHAN_THRESHOLD_S",
        "300",
        env.positive_int,
        "heartbeat age that makes an orphan",
        roles=env.WORKER,
    )
    orphan_boot_threshold_s: int = env.variable(
        "LUMASTRA_ORPHAN_BOOT_THRESHOLD_S",
        "120",
        env.positive_int,
        "heartbeat age that makes an orphan at boot recovery",
        roles=env.WORKER,
    )
    pending_check_after_s: int = env.variable(
        "LUMASTRA_PENDING_CHECK_AFTER_S",
        "60",
        env.positive_int,
        "pending this long: check the broker for its message (and a keyed run's turn lapses)",
        roles=env.STARTERS,
    )
    pending_deadline_s: int = env.variable(
        "LUMASTRA_PENDING_DEADLINE_S",
        "86400",
        env.positive_int,
        "pending this long: fail the run",
        roles=env.WORKER,
    )
    pipeline_recover_after_s: int = env.variable(
        "LUMASTRA_PIPELINE_RECOVER_AFTER_S",
        "30",
        env.positive_int,
        "a pipeline run between stages unmoved this long is checked by the reconciler",
        roles=env.WORKER,
    )
    reconcile_interval_s: int = env.variable(
        "LUMASTRA_RECONCILE_INTERVAL_S",
        "30",
        env.positive_int,
        "seconds between reconciler ticks",
        roles=env.WORKER,
    )
    due_poll_s: float = env.variable(
        "LUMASTRA_DUE_POLL_S",
        "0.25",
        env.positive_seconds,
        "seconds between looks for delayed starts whose time has come",
        roles=env.WORKER,
    )
    drain_interval_s: int = env.variable(
        "LUMASTRA_DRAIN_INTERVAL_S",
        "5",
        env.positive_int,
        "seconds between drain replays",
        roles=env.WORKER,
    )
    quota_rollup_interval_s: int = env.variable(
        "LUMASTRA_QUOTA_ROLLUP_INTERVAL_S",
        "30",
        env.positive_int,
        "seconds between roll-ups of uncapped tasks' daily counts into task_quota_usage",
        roles=env.WORKER,
    )
    scheduler_tick_s: int = env.variable(
        "LUMASTRA_SCHEDULER_TICK_S",
        "10",
        env.positive_int,
        "seconds between scheduler ticks (dynamic schedules)",
        roles=env.WORKER,
    )
    leader_ttl_s: int = env.variable(
        "LUMASTRA_LEADER_TTL_S",
        "15",
        env.positive_int,
        "lease of the leader lock lock:orch:cluster",
        roles=env.WORKER,
    )
    leader_renew_s: int = env.variable(
        "LUMASTRA_LEADER_RENEW_S",
        "5",
        env.positive_int,
        "seconds between a leader's renewals",
        roles=env.WORKER,
    )
    leader_jitter_s: float = env.variable(
        "LUMASTRA_LEADER_JITTER_S",
        "1",
        env.non_negative_seconds,
        "most random delay added to each attempt to take a leader lock",
        roles=env.WORKER,
    )
    worker_max_tasks_per_child: int = env.variable(
        "LUMASTRA_WORKER_MAX_TASKS_PER_CHILD",
        "0",
        env.non_negative_int,
        "runs before a child is recycled (0: never, only by memory)",
        roles=env.WORKER,
    )
    worker_max_memory_per_child_kb: int = env.variable(
        "LUMASTRA_WORKER_MAX_MEMORY_PER_CHILD_KB",
        "1048576",
        env.positive_int,
        "resident KiB after which a child is recycled",
        roles=env.WORKER,
    )
    stage_result_max_bytes: int = env.variable(
        "LUMASTRA_STAGE_RESULT_MAX_BYTES",
        "65536",
        env.positive_int,
        "largest JSON result a pipeline stage may return",
        roles=env.WORKER,
    )
