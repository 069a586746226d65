"""A run's Markdown report: YAML frontmatter (the run and its steps), then a readable body.

`GET /api/v1/runs/{id}/report.md` serves it; the admin's run page links to it. The
frontmatter is machine-readable (`run`, `steps`: the step records of `runs.steps`); the body
repeats what a person wants first: a table of the steps, the error with its kind, warnings.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import yaml

from orchestrator.models import TaskHistory
from orchestrator.runs import steps
from tasks import registry


def step_records(row: TaskHistory) -> list[dict[str, Any]]:
    return steps.of_run(
        registry.get().get(row.task_id),
        task_id=row.task_id,
        state=row.state,
        stages=row.stages,
        steps=row.steps,
        started_at=row.started_at,
        finished_at=row.finished_at,
        attempts=row.attempts,
        error=row.error,
        cost=row.cost_breakdown,
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def render(row: TaskHistory) -> str:
    records = step_records(row)
    front = {
        "run": {
            "id": row.id,
            "task": row.task_id,
            "state": row.state,
            "trigger": row.trigger,
            "priority": row.priority,
            "attempts": row.attempts,
            "created_at": _iso(row.created_at),
            "started_at": _iso(row.started_at),
            "finished_at": _iso(row.finished_at),
            "duration_s": row.duration_s,
            "cost": row.cost_breakdown,
        },
        "steps": records,
    }
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        f"# Run {row.id}: {row.task_id} — {row.state}",
        "",
        "| step | class | status | attempts | duration | cost |",
        "|---|---|---|---|---|---|",
    ]
    for record in records:
        duration = record.get("duration_ms")
        shown = f"{duration / 1000:.3f} s" if duration is not None else "—"
        cost = ", ".join(f"{kind} {units:g}" for kind, units in record["cost"].items()) or "—"
        lines.append(
            f"| {_cell(record['stage'])} | {record['resource_class'] or '—'} | "
            f"{record['status']} | {record['attempts']} | {shown} | {_cell(cost)} |"
        )
    if row.error:
        # Indented, not fenced: a message cannot end a code block it sits in.
        message = "\n".join(f"    {line}" for line in str(row.error.get("message")).splitlines())
        lines += ["", f"## Error: {row.error.get('kind')}", "", message]
    warned = [(r["stage"], warning) for r in records for warning in r["warnings"]]
    if warned:
        lines += ["", "## Warnings", ""]
        lines += [f"- **{_cell(stage)}**: {_cell(warning)}" for stage, warning in warned]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text that cannot break the table or the list it sits in."""
    return str(text).replace("|", "\\|").replace("\n", " ")
