"""An operator's retry: a new run of the same work at priority 1, linked to the original.

The original keeps its history; the new run's trigger names it (`retryOf`). Only an ended
run that did not complete can be retried: failed, or cancelled. A pipeline run is resumed:
the new run reuses the stages the original completed, with their results, and runs only the
failed stage and what follows it (`runs.pipeline.reuse_completed`; nothing is reused when the
task's processing_version changed since), unless the operator asks for a fresh start
(`reuse=False`). Asking to resume a run whose task is not a pipeline (`reuse=True`) is refused:
it has no stages to reuse, and a fresh run silently given for a resume would hide a mistake.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import OuterRef, QuerySet
from django.db.models.fields.json import KT

from orchestrator.models import TaskHistory
from orchestrator.runs import pipeline, spawn
from orchestrator.runs.cancel import UnknownRun
from orchestrator.runs.handle import RunHandle, StartRefused
from orchestrator.runs.start import start_run
from orchestrator.states import LIVE_RUN_STATES, RunState
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Priority

RETRYABLE = (RunState.FAILED, RunState.CANCELLED)


class NotRetryable(StartRefused):
    """The run is live or completed, or a resume of it would run its live children twice."""


class NotResumable(NotRetryable):
    """A resume was asked of a run whose task is not a pipeline."""


def rerun(run_id: str, *, actor: str, reuse: bool | None = None, once: bool = False) -> RunHandle:
    """A new run of `run_id`'s work. `reuse`: True resumes a pipeline, False starts it afresh,
    None (the default) resumes a pipeline and reruns anything else. `once`: refused when an
    operator retry already names the run (a retry by filter made twice at once, or again)."""
    row = (
        TaskHistory.objects.filter(id=run_id)
        .values_list(
            "task_id",
            "state",
            "input",
            "processing_version",
            "stages",
            "stage_results",
            "steps",
            "tags",
        )
        .first()
    )
    if row is None:
        raise UnknownRun(run_id)
    task_id, state, data, version, stages, results, steps, tags = row
    if state not in RETRYABLE:
        raise NotRetryable(f"run {run_id} is {state}; only failed or cancelled runs are retried")
    definition = registry.get()[task_id]
    if reuse and not definition.pipeline:
        raise NotResumable(
            f"run {run_id} is not a pipeline run ({task_id!r} has no stages to reuse); "
            "nothing was started: retry it fresh"
        )
    resumes = reuse is not False and bool(definition.pipeline)
    live = TaskHistory.objects.filter(parent_run_id=run_id, state__in=LIVE_RUN_STATES)
    if resumes and (children := live.count()):
        # The resume starts again the children that did not complete: not beside themselves.
        raise NotRetryable(
            f"run {run_id} still has {children} live children; cancel them or wait for "
            "them, then resume it"
        )
    # One transaction: the new run's message is published only once it has its reused stages.
    with transaction.atomic():
        if once:
            # The original's row lock makes two such retries take turns; the second sees the
            # first's run once it commits.
            list(TaskHistory.objects.select_for_update().filter(id=run_id).values_list("id"))
            if earlier := requeued_as([run_id]).get(run_id):
                raise NotRetryable(f"run {run_id} was retried already, as {earlier[-1]}")
        handle = start_run(
            task_id,
            data,
            trigger={"kind": TriggerKind.OPERATOR_RETRY.value, "actor": actor, "retryOf": run_id},
            priority=Priority.OPERATOR,
            tags=tags,  # found where the run it retries is
        )
        if resumes and not (handle.deduplicated or handle.dropped):
            original = pipeline.ReusableRun(version, stages, results, steps)
            reused = pipeline.reuse_completed(definition, handle.run_id, run_id, original)
            spawn.reuse(handle.run_id, run_id, reused, handle.priority)
    return handle


def dead_letters() -> QuerySet[TaskHistory]:
    """The runs that exhausted their retries: failed after their last attempt, waiting for an
    operator's `rerun`. One partial index (task_history_dead_letters) serves it, newest first."""
    return TaskHistory.objects.filter(state=RunState.FAILED, error__exhausted=True)


def retries_of(original: str | OuterRef) -> QuerySet[TaskHistory]:
    """The operator retries of `original` (a run's id, or an outer query's run), found as the
    task_history_retry_of index has them: its expression, on its partial condition (without
    which Postgres cannot use it)."""
    found = TaskHistory.objects.filter(trigger__has_key="retryOf")
    return found.alias(retry_of=KT("trigger__retryOf")).filter(retry_of=original)


def requeued_as(run_ids: Iterable[str]) -> dict[str, list[str]]:
    """The reruns of each of `run_ids` (the runs whose trigger names it), oldest id first."""
    retries = (
        TaskHistory.objects.filter(trigger__has_key="retryOf")
        .annotate(retry_of=KT("trigger__retryOf"))
        .filter(retry_of__in=list(run_ids))
        .values_list("retry_of", "id")
    )
    found: dict[str, list[str]] = {}
    for original, retry in retries:
        found.setdefault(original, []).append(retry)
    return {original: sorted(ids) for original, ids in found.items()}
