"""Step telemetry: what each step of a run did, kept in Postgres with the run.

Every run has at least one step: a pipeline run one per stage, a plain run one named after its
task. A step record (`task_history.steps[<step>]`, JSON) holds:

- `stage`, `resource_class`, `status` (`ok`, `failed`, `warning`, `skipped`, and while the run
  lives `running` or `waiting`), `started_at` (its first attempt), `finished_at`,
  `duration_ms` (first start to end, waits between attempts included), `attempts`;
- `cost` (units by kind, `ctx.spend`), `counters` (`ctx.count`), `warnings` (`ctx.warn`: a
  step that succeeds with warnings is `warning`), `error` (kind and message) when it failed,
  `reason` when it was skipped, `log_tail` (the last log lines of its last attempt that
  logged, `runs.context`).

A stage's record is written with its moves (claim, end, retry; `sql/claim_stage.sql`,
`sql/move_stage.sql`), the failure before the run's end. A plain run writes its warnings,
counters, cost and log tail with its terminal write, and only when it has any; the rest of
its step is the run's own columns, read back by `of_run`, so a no-op run writes nothing more.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from orchestrator.runs.context import RunContext
from orchestrator.states import RunState
from tasks.definition import TaskDefinition


class StepStatus(StrEnum):
    OK = "ok"  # succeeded
    WARNING = "warning"  # succeeded, with warnings
    FAILED = "failed"  # raised, timed out, or was stopped by the run's end
    SKIPPED = "skipped"  # never ran (its `when`, its dependencies, or the run's end)
    RUNNING = "running"  # an attempt is running
    WAITING = "waiting"  # not started yet, or waiting for its next attempt


def _added(before: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    total = dict(before or {})
    for name, value in more.items():
        total[name] = total.get(name, 0) + value
    return total


def attempt_ended(
    previous: dict[str, Any],
    context: RunContext,
    status: StepStatus,
    finished_at: datetime,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A stage's record after one attempt: `previous` (as its claim returned it) with this
    attempt's end, cost, counters and warnings added."""
    warnings = [*previous.get("warnings", []), *context.warnings]
    if status is StepStatus.OK and warnings:
        status = StepStatus.WARNING
    record: dict[str, Any] = {
        "status": status.value,
        "finished_at": finished_at.isoformat(),
        "cost": _added(previous.get("cost"), context.cost),
        "counters": _added(previous.get("counters"), context.counters),
        "warnings": warnings,
    }
    started = previous.get("started_at")
    if started:
        record["duration_ms"] = _ms_between(started, finished_at)
    if error is not None:
        record["error"] = {"kind": error["kind"], "message": error["message"]}
    if context.run_log.tail:
        record["log_tail"] = list(context.run_log.tail)
    return record


def skipped(reason: str, finished_at: datetime) -> dict[str, Any]:
    return {
        "status": StepStatus.SKIPPED.value,
        "reason": reason,
        "finished_at": finished_at.isoformat(),
    }


def _ms_between(started: str | datetime, finished: datetime) -> int:
    start = datetime.fromisoformat(started) if isinstance(started, str) else started
    return max(0, round((finished - start).total_seconds() * 1000))


_RUN_STATUS = {
    RunState.COMPLETED: StepStatus.OK,
    RunState.FAILED: StepStatus.FAILED,
    RunState.CANCELLED: StepStatus.FAILED,
    RunState.ACTIVE: StepStatus.RUNNING,
    RunState.CANCELLING: StepStatus.RUNNING,
    RunState.PENDING: StepStatus.WAITING,
}
_STAGE_STATUS = {
    "completed": StepStatus.OK,
    "failed": StepStatus.FAILED,
    "skipped": StepStatus.SKIPPED,
    "active": StepStatus.RUNNING,
    "waiting": StepStatus.WAITING,
}


def of_run(
    definition: TaskDefinition | None,
    *,
    task_id: str,
    state: str,
    stages: dict[str, str],
    steps: dict[str, Any],
    started_at: datetime | None,
    finished_at: datetime | None,
    attempts: int,
    error: dict[str, Any] | None,
    cost: dict[str, Any],
) -> list[dict[str, Any]]:
    """The run's steps in order, as the report and the API show them."""
    if stages:
        order = list(definition.stage_order) if definition else sorted(stages)
        return [_stage_step(definition, name, stages[name], steps.get(name, {})) for name in order]
    extras = steps.get(task_id, {})
    status = _RUN_STATUS.get(RunState(state), StepStatus.WAITING)
    if status is StepStatus.OK and extras.get("warnings"):
        status = StepStatus.WARNING
    step: dict[str, Any] = {
        "stage": task_id,
        "resource_class": definition.resource_class if definition else None,
        "status": status.value,
        "started_at": started_at.isoformat() if started_at else None,
        "finished_at": finished_at.isoformat() if finished_at else None,
        "duration_ms": _ms_between(started_at, finished_at) if started_at and finished_at else None,
        "attempts": attempts,
        "cost": cost or extras.get("cost", {}),
        "counters": extras.get("counters", {}),
        "warnings": extras.get("warnings", []),
    }
    if error and status is StepStatus.FAILED:
        step["error"] = {"kind": error.get("kind"), "message": error.get("message")}
    return [step]


def _stage_step(
    definition: TaskDefinition | None, name: str, state: str, record: dict[str, Any]
) -> dict[str, Any]:
    # The stage's state has the last word (the run's end closes stages without touching their
    # records); the record tells a success with warnings from a plain one.
    status = _STAGE_STATUS.get(state, StepStatus.WAITING).value
    if state == "completed" and record.get("status") == StepStatus.WARNING:
        status = StepStatus.WARNING.value
    resource_class = record.get("resource_class")
    if resource_class is None and definition is not None:
        resource_class = definition.stage(name).resource_class or definition.resource_class
    return {
        "stage": name,
        "resource_class": resource_class,
        "status": status,
        "started_at": record.get("started_at"),
        "finished_at": record.get("finished_at"),
        "duration_ms": record.get("duration_ms"),
        "attempts": record.get("attempts", 0),
        "cost": record.get("cost", {}),
        "counters": record.get("counters", {}),
        "warnings": record.get("warnings", []),
        **({"error": record["error"]} if "error" in record else {}),
        **({"reason": record["reason"]} if "reason" in record else {}),
        # A resumed run's stage that the original completed: its record is the original's.
        **({"reused_from": record["reused_from"]} if "reused_from" in record else {}),
    }
