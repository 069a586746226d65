"""One stage's attempt of a pipeline run, and the stages whose worker was lost.

A stage message (`run_stage_message`) claims its stage, runs the stage's body under the run's
watch as the run's owner, and ends the attempt with one guarded move: completed, failed (the
run fails with the stage named), or back to waiting with the retry's backoff. Then the live
hash follows and the run moves on (`pipeline.advance`). A move Postgres refused on a transient
error waits in the drain; its replay calls `_replayed`, which does what the writer skipped.

A stage whose worker was lost is tried again while it has attempts, else fails its run:
- a claimer dead on this host, found when the stage's message comes back (`_claim_refused`)
  or when a stopping worker hands its runs back (`put_back_dead_stage`);
- a claimer gone on any host, found by the reconciler (`put_back_lost_stages`).
The pipeline's whole story, and what is not guaranteed, is `runs.pipeline`'s docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery.exceptions import Reject
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel

from orchestrator import tracing
from orchestrator.cluster.instance import instance_id, is_dead_here
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Parked, StagePickup
from orchestrator.models import TaskHistory
from orchestrator.routing import stage_class
from orchestrator.runs import drain, execute, retries, spawn, steps, terminal
from orchestrator.runs.context import RunContext
from orchestrator.runs.pipeline import PipelineRun, advance, end_cancelled_if_idle, follow
from orchestrator.runs.publish import publish_stage
from orchestrator.runs.runner import task_connections
from orchestrator.runs.steps import StepStatus
from orchestrator.runs.watch import watching
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import durable
from orchestrator.stores.durable import Stages
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind, TaskError
from tasks.pipeline import Stage
from tasks.policies import Retry

log = logging.getLogger(__name__)

# A message from a newer deploy goes back to the queue for a newer worker (as in the runner).
REQUEUE_PAUSE_S = 1.0


def run_stage_message(task_id: str, stage: str, run_id: str, processing_version: int) -> None:
    with task_connections():
        _run_stage(registry.get()[task_id], stage, run_id, processing_version)


def _run_stage(definition: TaskDefinition, name: str, run_id: str, processing_version: int) -> None:
    if processing_version > definition.processing_version:
        time.sleep(REQUEUE_PAUSE_S)
        raise Reject(f"run {run_id}: stage {name} needs a newer worker", requeue=True)
    stage = definition.stage(name)
    try:
        hooks.before_stage(StagePickup(definition, run_id, name, stage_class(definition, stage)))
    except Parked as parked:
        # Waiting, its message acknowledged: the resume publishes it again (`recovery.pauses`).
        log.info("run %s: stage %s held by the pause of %s; parked", run_id, name, parked.held_by)
        return
    claimed = durable.claim_stage(run_id, name, stage_class(definition, stage), instance_id())
    if claimed is None:
        # Its run is no longer active (ended, cancelling) or the stage is not waiting (this
        # message is a duplicate, or the run's end closed the stage, or its claimer died).
        log.info("run %s: stage %s not claimed; message dropped", run_id, name)
        _claim_refused(definition, run_id, stage)
        return
    follow(run_id, name, StageState.ACTIVE)
    model = definition.input_model.model_validate(claimed.input)
    run = PipelineRun(definition, run_id, claimed.owner, claimed.identity, claimed.priority, model)
    context = RunContext(
        run_id,
        model,
        task_id=definition.id,
        results=claimed.results,
        stage=name,
        priority=claimed.priority,
    )
    attempt = _Attempt(run, stage, claimed.step, context)
    if tracing.ON:
        tracing.claimed({"lumastra.attempt": attempt.number})
    if processing_version < definition.processing_version:
        message = (
            f"enqueued for processing_version {processing_version}, "
            f"current is {definition.processing_version}"
        )
        _stage_attempt_failed(attempt, ErrorKind.STALE_VERSION, message)
        return

    def call() -> Any:
        with watching(_as_watched(definition, stage), run_id, claimed.owner, context):
            return _keepable(stage.execute(context, model))

    timeout = (stage.timeout or definition.timeout).soft
    outcome = execute.outcome_of(call, soft_timeout=timeout, what=f"run {run_id}: stage {name}")
    ended = StageState.COMPLETED.value if outcome.kind is None else outcome.kind.value
    with tracing.ending(ended) if tracing.ON else tracing.OFF:
        if outcome.kind is None:
            _stage_completed(attempt, outcome.result)
        else:
            _stage_attempt_failed(attempt, outcome.kind, outcome.message, **outcome.extra)


@dataclass(frozen=True)
class _Attempt:
    """One attempt of one stage: what its end writes on the stage's step record."""

    run: PipelineRun
    stage: Stage
    step: dict[str, Any]  # the record as the claim left it (this attempt counted)
    context: RunContext

    @property
    def number(self) -> int:
        return int(self.step.get("attempts", 1))

    @property
    def retry(self) -> Retry:
        return self.stage.retry or self.run.definition.retry

    @property
    def claimer(self) -> str | None:
        """The process whose claim this attempt is: its moves are fenced by it."""
        owner = self.step.get("owner")
        return str(owner) if owner else None

    def may_put_back(self) -> bool:
        """Its worker lost, the stage may be tried again (`runs.put_back`, for stages)."""
        return retries.may_retry(
            ErrorKind.WORKER_LOST,
            self.number,
            self.retry,
            retry_on_worker_loss=self.run.definition.retry_on_worker_loss,
        )

    def ended(self, status: StepStatus, error: dict[str, Any] | None = None) -> dict[str, Any]:
        return steps.attempt_ended(self.step, self.context, status, timezone.now(), error)


def put_back_dead_stage(definition: TaskDefinition, run_id: str, name: str) -> None:
    """A stage whose claimer, a process of this host, is dead (killed at a worker's shutdown,
    `runs.handback`): tried again while it has attempts, else failed with its run."""
    _claim_refused(definition, run_id, definition.stage(name))


def _claim_refused(definition: TaskDefinition, run_id: str, stage: Stage) -> None:
    """A stage message whose claim was refused, read once to decide what it still owes:
    - its run is being cancelled (`discard` did not find this message waiting: a worker had
      reserved it): the run ends cancelled here if no stage of it still runs;
    - its stage is active, claimed by a process of this host that is dead (a pool child killed
      mid-stage: its message is rejected back to the queue): the stage is tried again if it
      has attempts left, else it fails, and the run with it. A claimer on another host, or
      alive, is left to its heartbeat and the orphan path."""
    found = (
        TaskHistory.objects.filter(id=run_id)
        .values_list(
            "state", "stages", "steps", "input", "owner_instance_id", "identity", "priority"
        )
        .first()
    )
    if found is None:
        return
    state, stages, records, input_, owner, identity, priority = found
    if state == RunState.CANCELLING:
        if StageState.ACTIVE.value not in stages.values():
            terminal.cancel(definition, run_id, owner)
        return
    if state != RunState.ACTIVE or stages.get(stage.name) != StageState.ACTIVE:
        return
    record = records.get(stage.name, {})
    claimer = record.get("owner", "")
    if not claimer or not is_dead_here(claimer):
        return
    if stage.name in drain.waiting_stages(run_id):
        # Its claimer ended it before it died; the end waits for Postgres in the drain.
        return
    model = definition.input_model.model_validate(input_)
    run = PipelineRun(definition, run_id, owner, identity, priority, model)
    context = RunContext(run_id, model, task_id=definition.id)
    attempt = _Attempt(run, stage, record, context)
    _stage_attempt_failed(attempt, ErrorKind.WORKER_LOST, f"its worker {claimer} stopped mid-stage")


def _as_watched(definition: TaskDefinition, stage: Stage) -> TaskDefinition:
    """The definition the watchdogs judge a stage by: the stage's timeout, else the task's."""
    if stage.timeout is None:
        return definition
    return dataclasses.replace(definition, timeout=stage.timeout)


class _NotKeepable(TaskError):
    """A stage's result that cannot be kept: the stage fails, permanently."""

    kind = ErrorKind.PERMANENT


def _keepable(result: object) -> Any:
    """The stage's result as it is kept: JSON, within LUMASTRA_STAGE_RESULT_MAX_BYTES."""
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    try:
        size = len(json.dumps(result).encode())
    except (TypeError, ValueError) as exc:
        raise _NotKeepable(f"its result is not JSON-serialisable: {exc}") from None
    cap = settings.CONFIG.stage_result_max_bytes
    if size > cap:
        raise _NotKeepable(
            f"its result is {size} bytes as JSON, over the cap of {cap} "
            "(LUMASTRA_STAGE_RESULT_MAX_BYTES); keep large data elsewhere and return a reference"
        )
    return result


def _stage_completed(attempt: _Attempt, result: Any) -> None:
    _end_stage(attempt, StageState.COMPLETED, {}, result=result, step=attempt.ended(StepStatus.OK))


def _stage_attempt_failed(
    attempt: _Attempt, kind: ErrorKind, message: str, **extra: Any
) -> retries.Decision:
    """The attempt failed: the stage is tried again or fails, by the one retry rule
    (`runs.retries`); a stage out of attempts makes its run a dead letter."""
    name = attempt.stage.name
    decision = retries.decide(
        kind,
        f"stage {name}: {message}",
        attempt.number,
        attempt.retry,
        retry_on_worker_loss=attempt.run.definition.retry_on_worker_loss,
        stage=name,
        **extra,
    )
    if decision.delay is not None:
        _stage_retry(attempt, kind, decision.error, decision.delay)
    else:
        _stage_failed(attempt, decision.error)
    return decision


def _stage_failed(attempt: _Attempt, error: dict[str, Any]) -> None:
    """The stage fails, its step record first; then the run fails with the stage named."""
    step = attempt.ended(StepStatus.FAILED, error)
    _end_stage(attempt, StageState.FAILED, {"error": error}, step=step)


def _stage_retry(
    attempt: _Attempt,
    kind: ErrorKind,
    error: dict[str, Any],
    delay: timedelta,
    *,
    stale_after_s: float | None = None,
) -> bool:
    """A TransientError (or a lost worker) with attempts left: the stage alone waits for its
    next attempt (active → waiting), with the stage's backoff, and its message is published
    again with that delay. The move is fenced by the attempt's claim and, with
    `stale_after_s`, by the run's heartbeat being still that old. Returns whether it moved
    (or waits in the drain to)."""
    run = attempt.run
    then = {"delay_s": delay.total_seconds(), "kind": kind.value}
    step = attempt.ended(StepStatus.WAITING, error)
    if _end_stage(attempt, StageState.WAITING, then, step=step, stale_after_s=stale_after_s):
        return True
    end_cancelled_if_idle(run.definition, run.run_id)
    return False


def _end_stage(attempt: _Attempt, target: StageState, then: dict[str, Any], **args: Any) -> bool:
    """An attempt's end: its stage's move in Postgres, fenced by the attempt's claim, then
    what follows it (`_stage_moved`, with `then`). A move Postgres refused on a transient error
    waits in the drain, which makes the same call once Postgres is back, then what follows;
    nothing of it reaches Valkey before. False when the move was refused as illegal."""
    run, name = attempt.run, attempt.stage.name
    call = {"stage": name, "cost": attempt.context.cost, "claimer": attempt.claimer, **args}
    ids = (run.run_id, name, target.value)
    # The children it spawned are written with its completion, and only with it.
    spawned = attempt.context.spawned if target is StageState.COMPLETED else []
    spawn.abandon(attempt.context.spawned if not spawned else [])
    try:
        with transaction.atomic() if spawned else contextlib.nullcontext():
            stages = durable.move_stage(
                run.run_id, target=target, active_only=bool(spawned), **call
            )
            awaited = bool(run.definition.awaiting(name))
            spawn.record(spawn.Parent(run.run_id, name, run.priority, awaited), spawned)
    except IllegalTransition as exc:
        spawn.abandon(spawned)
        if spawned:
            # Its run is being cancelled: the stage ends, its children are not written.
            attempt.context.spawned.clear()
            return _end_stage(attempt, target, then, **args)
        log.info("run %s: stage %s %s not recorded (%s)", *ids, exc)
        return False
    except drain.TRANSIENT_ERRORS as exc:
        if spawned:
            # Its children cannot wait in the drain: nothing is written, and the stage is
            # found lost and tried again (`put_back_lost_stages`).
            spawn.abandon(spawned)
            log.error("run %s: stage %s %s and its children not written: %s", *ids, exc)
            return True
        # Postgres is away: the drain makes this same move, then what follows it, so Valkey
        # is never ahead of Postgres.
        log.warning("run %s: stage %s %s deferred to the drain: %s", *ids, exc)
        pushed = drain.push(run.run_id, target, call, run.owner, call=drain.MOVE_STAGE, then=then)
        if not pushed:
            log.error("run %s: stage %s %s lost; the reconciler will try the stage again", *ids)
        return True
    _stage_moved(run, attempt.stage, target, stages, then)
    return True


def _stage_moved(
    run: PipelineRun, stage: Stage, target: StageState, stages: Stages, then: dict[str, Any]
) -> None:
    """What follows a stage's end once Postgres has it, from its writer or from the drain's
    replay (`_replayed`): the live hash follows; then the advance (completed), the run's
    failure with the stage's error (failed) or the stage's next message with the retry's
    delay (back to waiting)."""
    follow(run.run_id, stage.name, target)
    if target == StageState.COMPLETED:
        advance(run, stages, ended=(stage.name,))
    elif target == StageState.FAILED:
        terminal.end(run.definition, run.run_id, run.owner, RunState.FAILED, error=then["error"])
    else:
        delay = timedelta(seconds=then["delay_s"])
        log.info("run %s: stage %s %s; retry in %s", run.run_id, stage.name, then["kind"], delay)
        publish_stage(run.definition, stage, run.run_id, run.identity, run.priority, delay)


@drain.on_stage_move
def _replayed(entry: drain.Entry, stages: Stages) -> None:
    """A stage's end the drain made once Postgres was back: what its writer skipped."""
    found = (
        TaskHistory.objects.filter(id=entry.run_id)
        .values_list("task_id", "input", "identity", "priority")
        .first()
    )
    definition = registry.get().get(found[0]) if found else None
    if found is None or definition is None:
        log.warning("run %s: drained stage move of an unknown run or task; left", entry.run_id)
        return
    _, input_, identity, priority = found
    model = definition.input_model.model_validate(input_)
    run = PipelineRun(definition, entry.run_id, entry.owner, identity, priority, model)
    stage = definition.stage(entry.args["stage"])
    _stage_moved(run, stage, StageState(entry.target), stages, entry.then)


def put_back_lost_stages(
    definition: TaskDefinition, run_id: str, why: str, stale_after_s: float
) -> int | None:
    """The reconciler found this pipeline run's heartbeat stale in both stores while a stage
    of it was running: its claimer is gone, on whatever host. Each running stage goes back
    to waiting for its next attempt (fenced by its claim and by the heartbeat still being
    stale) and is published again with its backoff. None, and nothing written, when a running
    stage may not be tried again (attempts spent, or the task opted out): the caller ends the
    run as an orphan. Otherwise the number of stages put back (0: it moved on meanwhile).
    A stage whose end waits in the drain (`drain.waiting_stages`) is not lost: it is left
    alone, and a run with no other stage running has moved on (0)."""
    found = (
        TaskHistory.objects.filter(id=run_id, state=RunState.ACTIVE)
        .values_list("stages", "steps", "input", "owner_instance_id", "identity", "priority")
        .first()
    )
    if found is None:
        return 0
    stages, records, input_, owner, identity, priority = found
    active = [name for name in definition.stage_order if stages.get(name) == StageState.ACTIVE]
    # Read after the row: a stage whose end Postgres refused is in the drain by then.
    in_drain = drain.waiting_stages(run_id)
    running = [name for name in active if name not in in_drain]
    model = definition.input_model.model_validate(input_)
    run = PipelineRun(definition, run_id, owner, identity, priority, model)
    attempts = [
        _Attempt(
            run,
            definition.stage(name),
            records.get(name, {}),
            RunContext(run_id, model, task_id=definition.id),
        )
        for name in running
    ]
    if active and not running:
        return 0
    if not attempts or not all(attempt.may_put_back() for attempt in attempts):
        return None
    moved = 0
    for index, attempt in enumerate(attempts):
        message = f"{why}; its worker {attempt.claimer or 'unknown'} was running it"
        decision = retries.decide(
            ErrorKind.ORPHANED,
            f"stage {attempt.stage.name}: {message}",
            attempt.number,
            attempt.retry,
            retry_on_worker_loss=definition.retry_on_worker_loss,
            stage=attempt.stage.name,
        )
        assert decision.delay is not None  # every attempt may be put back (above)
        # The first move stamps the run's heartbeat: the stale heartbeat is checked by it, the
        # later stages' moves are fenced by their claims alone.
        stale = stale_after_s if index == 0 else None
        if _stage_retry(
            attempt, ErrorKind.ORPHANED, decision.error, decision.delay, stale_after_s=stale
        ):
            moved += 1
        elif index == 0:
            return 0  # it moved on since it was judged: a heartbeat landed, or a stage ended
    return moved
