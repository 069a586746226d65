"""An operator's retry: a new run of the same work at priority 1, linked to the original.

The original keeps its history; the new run's trigger names it (`retryOf`). Only an ended
run that did not complete can be retried: failed, or cancelled.
"""

from __future__ import annotations

from orchestrator.models import TaskHistory
from orchestrator.runs.cancel import UnknownRun
from orchestrator.runs.start import RunHandle, StartRefused, start_run
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tasks.definition import Priority

RETRYABLE = (RunState.FAILED, RunState.CANCELLED)


class NotRetryable(StartRefused):
    """The run is live or completed."""


def rerun(run_id: str, *, actor: str) -> RunHandle:
    row = TaskHistory.objects.filter(id=run_id).values_list("task_id", "state", "input").first()
    if row is None:
        raise UnknownRun(run_id)
    task_id, state, data = row
    if state not in RETRYABLE:
        raise NotRetryable(f"run {run_id} is {state}; only failed or cancelled runs are retried")
    return start_run(
        task_id,
        data,
        trigger={"kind": TriggerKind.OPERATOR_RETRY.value, "actor": actor, "retryOf": run_id},
        priority=Priority.OPERATOR,
    )
