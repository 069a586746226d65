"""An operator's retry: a new run of the same work at priority 1, linked to the original.

The original keeps its history; the new run's trigger names it (`retryOf`). Only an ended
run that did not complete can be retried: failed, or cancelled. A pipeline run is resumed:
the new run reuses the stages the original completed, with their results, and runs only the
failed stage and what follows it (`runs.pipeline.reuse_completed`; nothing is reused when the
task's processing_version changed since), unless the operator asks for a fresh start
(`reuse=False`).
"""

from __future__ import annotations

from django.db import transaction

from orchestrator.models import TaskHistory
from orchestrator.runs import pipeline
from orchestrator.runs.cancel import UnknownRun
from orchestrator.runs.start import RunHandle, StartRefused, start_run
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Priority

RETRYABLE = (RunState.FAILED, RunState.CANCELLED)


class NotRetryable(StartRefused):
    """The run is live or completed."""


def rerun(run_id: str, *, actor: str, reuse: bool = True) -> RunHandle:
    row = (
        TaskHistory.objects.filter(id=run_id)
        .values_list(
            "task_id", "state", "input", "processing_version", "stages", "stage_results", "steps"
        )
        .first()
    )
    if row is None:
        raise UnknownRun(run_id)
    task_id, state, data, version, stages, results, steps = row
    if state not in RETRYABLE:
        raise NotRetryable(f"run {run_id} is {state}; only failed or cancelled runs are retried")
    definition = registry.get()[task_id]
    # One transaction: the new run's message is published only once it has its reused stages.
    with transaction.atomic():
        handle = start_run(
            task_id,
            data,
            trigger={"kind": TriggerKind.OPERATOR_RETRY.value, "actor": actor, "retryOf": run_id},
            priority=Priority.OPERATOR,
        )
        if reuse and definition.pipeline and not (handle.deduplicated or handle.dropped):
            original = pipeline.ReusableRun(version, stages, results, steps)
            pipeline.reuse_completed(definition, handle.run_id, run_id, original)
    return handle
