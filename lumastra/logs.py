"""How every role writes its process log: human-readable lines by default, JSON lines with
LUMASTRA_LOG_FORMAT=json (one object per line: `timestamp`, `level`, `logger`, `event`, and
`instance`, `run_id`, `task`, `stage` where known, `trace_id` and `span_id` when traced), through
structlog's stdlib formatter, so records of every library (Django, Celery, ours) come out the
same way.

The run's fields come from structlog's context variables, bound by the run's watch around its
handler (`orchestrator.runs.watch.watching`): every record logged in the handler's thread while
it runs, by the engine or by the handler, carries them (the watch thread's own records, such as
a heartbeat warning, name the run in their message instead).
"""

from __future__ import annotations

from typing import Any

import structlog

from orchestrator import tracing


def _instance(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    from orchestrator.cluster.instance import instance_id

    event.setdefault("instance", instance_id())
    return event


def _trace(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    # Traced, a record names the span it was logged in, so a log line leads to its trace.
    if tracing.ON and (ids := tracing.current_ids()):
        event["trace_id"], event["span_id"] = ids
    return event


def logging_config(log_format: str) -> dict[str, Any]:
    """Django's LOGGING for `log_format` (`plain` or `json`)."""
    formatters: dict[str, Any] = {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": structlog.stdlib.ProcessorFormatter,
            "processor": structlog.processors.JSONRenderer(),
            "foreign_pre_chain": [
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                _instance,
                _trace,
                structlog.processors.format_exc_info,
            ],
        },
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": formatters,
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": log_format}},
        "root": {"handlers": ["console"], "level": "INFO"},
    }
