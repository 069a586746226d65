"""Pipeline runs: every stage its own message, the DAG advanced by the engine (issue 10).

This module moves the run: its first stages (`begin`), the advance after each stage's end,
the cancel (`discard`), the stalled run's recovery and a resume's reused stages. One stage's
attempt, its end and the stages whose worker was lost are `runs.stage_attempts`.

A pipeline run is claimed like any run, by its first message (`runs.runner`), which checks the
input and dispatches the stages that depend on nothing. From then on the run stays `active`
while its stages move, each on the pool of its own resource class (`routing.stage_queue`):

- A stage message claims its stage: waiting → active in one guarded UPDATE that returns the
  run's input, its owner and the results so far (Postgres first; the live hash follows). The
  stage's body runs under the run's watch, as the run's owner: heartbeats, the cancel
  listener, the watchdogs with the stage's own timeout.
- Its end is one guarded move of the stage (state and result) that returns every stage as the
  move left it; then the live hash follows, then the advance. A move Postgres refuses on a
  transient error (unreachable, a dropped connection) waits in the pending-write drain
  (`runs.drain`) as that same call; the drain makes it once Postgres is back, then what the
  writer would have done after it. Until then the stage reads `active` in both stores, and it
  is not tried again as lost: the reconciler leaves the run alone while a write of it waits in
  the drain, and the lost-stage paths of `runs.stage_attempts` leave a stage whose end waits there.
- The advance looks at the stages that depend on the one that ended: one whose dependencies
  are all completed or skipped is due. A due stage whose dependencies were all skipped is
  skipped too; otherwise its `when` is asked now, just before dispatch: False skips it, True
  publishes its message. A skip advances in turn. The move that leaves no stage waiting or
  active ends the run `completed`, with the stages' results as the run's result.
- A stage that raises, times out or returns what cannot be kept fails; the run fails with the
  stage named in its error, and its stages that never started become `skipped` (a stage still
  running elsewhere is marked `failed`, and its own end is then refused).

Concurrent ends of one run queue on the run's row lock, and each move returns the stages as it
left them, so exactly one writer sees the last stage end; the run's terminal write is guarded
as for every run, so the run ends once.

A cancel (`discard`) takes the waiting stage messages out of their queues and ends the run
`cancelled` once no stage runs: at once when none does, else when the running one stops (the
cancel signal reaches it as it reaches any run; it is marked `failed` by the run's end).
Completed stages keep their state and results.

A TransientError retries the stage alone (its `retry`, else the task's): the stage goes back to
`waiting` with the error on its step record, and its message is published again with the
backoff as its delay. Each attempt's end writes the stage's step record (`runs.steps`) in the
same UPDATE as its move, a failure before the run's end.

A resume (`reuse_completed`, from `runs.rerun`) gives a new run the stages its original
completed. A run stalled between stages (a due stage's message lost, an advance a crash cut
short) is moved on by the reconciler (`recovery.stages`); a stage whose claimer died on this
host is tried again when its message comes back (`runs.stage_attempts`).

A stage whose claimer died on another host is found by the reconciler (the run's heartbeat
stale in both stores, `recovery.orphans`): each running stage goes back to waiting and is
published again while it has attempts (`stage_attempts.put_back_lost_stages`), and the run
fails as an orphan only when one has none left. Every move of an attempt is fenced by its
claim (the step record's `owner`), so a claimer that was only stopped, not dead, cannot end
the stage its successor runs. A task with `retry_on_worker_loss=False` fails instead of retrying.

Not guaranteed: `when` may be asked more than once for a stage (a recovery after a crash asks
it again); a stage's message carries no delay once the recovery publishes it again, so a
retry's backoff can be cut short after a crash; a stopped claimer (SIGSTOP) keeps beating for
the run when it wakes (a stage shares its run's claim), so it runs its stage to its end,
beside the successor, and only its writes are refused. A stage end the drain refused (full,
or Valkey unreachable too) is lost: the reconciler finds the stage lost and tries it again, or
fails the run when it has no attempt left. A stage end that reaches the drain only after the
reconciler looked at its run (its failed Postgres write took longer than the orphan threshold;
LUMASTRA_STORE_TIMEOUT_S is meant to be well under it) is tried again too, and the drained end
is then dropped as superseded.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from orchestrator.models import TaskHistory
from orchestrator.routing import stage_queue
from orchestrator.runs import retries, steps, terminal
from orchestrator.runs.context import RunContext
from orchestrator.runs.publish import publish_stage, stage_message_id
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import broker, durable, live, queries
from orchestrator.stores.durable import Stages
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

_ENDED = frozenset({StageState.COMPLETED.value, StageState.SKIPPED.value})


@dataclass(frozen=True)
class PipelineRun:
    """A pipeline run as one process sees it while it moves the run's stages."""

    definition: TaskDefinition
    run_id: str
    owner: str  # the run's claim: fences its hash and its heartbeats
    identity: str
    priority: int
    input: BaseModel


def begin(definition: TaskDefinition, run: durable.ClaimedRun, owner: str) -> None:
    """The run's own message, just claimed: dispatch the stages that depend on nothing."""
    try:
        model = definition.input_model.model_validate(run.input)
    except ValidationError as exc:
        error = retries.error_doc(ErrorKind.VALIDATION, str(exc))
        terminal.end(
            definition, run.run_id, owner, RunState.FAILED, error=error, attempt=run.attempts
        )
        return
    states = run.stages or {name: StageState.WAITING.value for name in definition.stage_order}
    for name, state in states.items():
        if state == StageState.COMPLETED:
            # Reused by a resume (`reuse_completed`): the live hash, seeded with every stage
            # waiting, follows Postgres.
            follow(run.run_id, name, StageState.ACTIVE)
            follow(run.run_id, name, StageState.COMPLETED)
    pipeline_run = PipelineRun(definition, run.run_id, owner, run.identity, run.priority, model)
    advance(pipeline_run, Stages(states, run.results), ended=())


def advance_stalled(
    definition: TaskDefinition,
    run_id: str,
    input_: Any,
    owner: str,
    identity: str,
    priority: int,
    stages: Stages,
    queued: set[str],
) -> int:
    """A run between stages that nobody moved for a while (`recovery.stages`): end it if every
    stage has ended, else dispatch its due stages whose messages are not in `queued` (stage
    message ids found in the broker). Returns how many moves it made."""
    model = definition.input_model.model_validate(input_)
    run = PipelineRun(definition, run_id, owner, identity, priority, model)
    moves = advance(run, stages, ended=(), queued=queued)
    if moves:
        log.warning("run %s: stalled between stages; %d moves made by recovery", run_id, moves)
    return moves


def reuse_completed(
    definition: TaskDefinition, new_run_id: str, original_id: str, original: ReusableRun
) -> list[str]:
    """A resume: the new run `new_run_id`, still pending in the caller's transaction, takes the
    stages `original` completed, with their results and step records (marked `reused_from`),
    so only the failed stage and what follows run again. Nothing is reused when the task's
    processing_version changed since the original ran: an older version's results are not
    this version's. Returns the stages reused."""
    if original.processing_version != definition.processing_version:
        return []
    reused = [
        name for name in definition.stage_order if original.stages.get(name) == StageState.COMPLETED
    ]
    if not reused:
        return []
    states = {name: StageState.COMPLETED.value for name in reused}
    results = {name: original.results[name] for name in reused if name in original.results}
    records = {
        name: {**original.steps.get(name, {}), "reused_from": original_id, "cost": {}}
        for name in reused
    }
    durable.reuse_stages(new_run_id, states, results, records)
    return reused


def discard(definition: TaskDefinition, run_id: str, error: dict[str, Any]) -> RunState:
    """The cancel of a pipeline run Postgres has just marked cancelling. No stage can be claimed
    from now on (a claim needs the run active); the stage messages still waiting are taken out
    of their queues, and a run with no stage running is cancelled at once. A running stage is
    told by the cancel signal, like any run, and the run ends cancelled when it stops. Stages
    that finished keep their state and results."""
    per_task = settings.CONFIG.per_task_queues
    for stage in definition.pipeline:
        queue = stage_queue(definition, stage, per_task)
        while broker.remove_waiting(queue, stage_message_id(run_id, stage.name)):
            pass
    if end_cancelled_if_idle(definition, run_id, error):
        return RunState.CANCELLED
    return RunState.CANCELLING


def end_cancelled_if_idle(
    definition: TaskDefinition, run_id: str, error: dict[str, Any] | None = None
) -> bool:
    """Ends a run being cancelled if no stage of it still runs; says whether it did."""
    row = TaskHistory.objects.filter(id=run_id).values_list("state", "stages", "owner_instance_id")
    found = row.first()
    if found is None or found[0] != RunState.CANCELLING:
        return False
    if StageState.ACTIVE.value in found[1].values():
        return False
    terminal.cancel(definition, run_id, found[2], error=error)
    return True


def advance(
    run: PipelineRun, stages: Stages, ended: Iterable[str], queued: Collection[str] = ()
) -> int:
    """Dispatch or skip the stages that the end of `ended` made due (with no `ended`: every
    waiting stage whose dependencies have all ended); end the run when no stage is left to
    run. `stages` is the run's stages as this process's last move left them; a stage whose
    message id is in `queued` is not published again. Returns how many moves it made."""
    definition = run.definition
    ended_now = set(ended)
    starting = not ended_now
    moves = 0
    waits: dict[str, Settled] | None = None  # read once, for a stage awaiting children
    for name in definition.stage_order:
        if stages.states.get(name) != StageState.WAITING:
            continue
        after = definition.stage(name).after
        due = starting or bool(ended_now.intersection(after))
        if not due or any(stages.states.get(dep) not in _ENDED for dep in after):
            continue
        if definition.stage(name).await_children:
            waits = settled(run.run_id) if waits is None else waits
            if not _children_ended(waits, after):
                continue
        try:
            reason = _skip_reason(run, name, stages)
        except Exception as exc:
            log.exception("run %s: `when` of stage %s raised", run.run_id, name)
            message = f"stage {name}: its `when` raised {type(exc).__name__}: {exc}"
            error = retries.error_doc(ErrorKind.INTERNAL, message, stage=name)
            terminal.end(definition, run.run_id, run.owner, RunState.FAILED, error=error)
            return moves + 1
        if reason is None:
            if stage_message_id(run.run_id, name) not in queued:
                publish_stage(
                    definition, definition.stage(name), run.run_id, run.identity, run.priority
                )
                moves += 1
            continue
        try:
            stages = durable.move_stage(
                run.run_id, name, StageState.SKIPPED, step=steps.skipped(reason, timezone.now())
            )
        except IllegalTransition as exc:
            log.info("run %s: stage %s not skipped (%s)", run.run_id, name, exc)
            continue
        log.info("run %s: stage %s skipped: %s", run.run_id, name, reason)
        follow(run.run_id, name, StageState.SKIPPED)
        ended_now.add(name)
        moves += 1
    if stages.states and all(state in _ENDED for state in stages.states.values()):
        terminal.end(definition, run.run_id, run.owner, RunState.COMPLETED, result=stages.results)
        moves += 1
    return moves


@dataclass(frozen=True)
class Settled:
    """A stage's children as its waiting dependants see them."""

    ended: bool  # every child of every batch it spawned has ended
    failed_parent: bool  # a `fail_parent` child ended otherwise than completed


def settled(run_id: str) -> dict[str, Settled]:
    """By spawning stage: whether its children have all ended, and whether one failed its
    parent. A stage that spawned nothing is not in it."""
    with connection.cursor() as cursor:
        cursor.execute(queries.BATCHES_OF_PARENT, {"parent_run_id": run_id})
        return {stage: Settled(ended, failed) for stage, ended, failed in cursor.fetchall()}


def _children_ended(waits: dict[str, Settled], after: Iterable[str]) -> bool:
    """Every child its dependencies spawned has ended, and none failed its parent (that
    failure ends the run instead: `runs.children`)."""
    return all(
        dep not in waits or (waits[dep].ended and not waits[dep].failed_parent) for dep in after
    )


@dataclass(frozen=True)
class ReusableRun:
    """What a resume reads of the run it resumes."""

    processing_version: int
    stages: dict[str, str]
    results: dict[str, Any]
    steps: dict[str, Any]


def _skip_reason(run: PipelineRun, name: str, stages: Stages) -> str | None:
    stage = run.definition.stage(name)
    if stage.after and all(stages.states.get(dep) == StageState.SKIPPED for dep in stage.after):
        return "every stage it depends on was skipped"
    if stage.when is not None:
        context = RunContext(
            run.run_id, run.input, task_id=run.definition.id, results=stages.results, spawns=False
        )
        if not stage.when(context):
            return "its `when` said no"
    return None


def follow(run_id: str, stage: str, target: StageState) -> None:
    """The live hash follows a stage move Postgres has made; a disagreement is logged."""
    try:
        live.transition_stage(run_id, stage, target)
    except Exception as exc:
        log.warning(
            "run %s: stage %s is %s in Postgres; live hash not moved: %s",
            run_id,
            stage,
            target.value,
            exc,
        )
