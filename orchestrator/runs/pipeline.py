"""Pipeline runs: every stage its own message, the DAG advanced by the engine (issue 10).

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
  writer would have done after it (`_stage_moved`). Until then the stage reads `active` in
  both stores, and it is not tried again as lost: the reconciler leaves the run alone while
  a write of it waits in the drain, and `resume_lost_stages` and `_claim_refused` leave a
  stage whose end waits there.
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
host is tried again when its message comes back (`_claim_refused`).

A stage whose claimer died on another host is found by the reconciler (the run's heartbeat
stale in both stores, `recovery.orphans`): each running stage goes back to waiting and is
published again while it has attempts (`resume_lost_stages`), and the run fails as an orphan
only when one has none left. Every move of an attempt is fenced by its claim (the step
record's `owner`), so a claimer that was only stopped, not dead, cannot end the stage its
successor runs. A task with `retry_on_worker_loss=False` fails instead of retrying.

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

import dataclasses
import json
import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from celery.exceptions import Reject
from django.conf import settings
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from orchestrator.backoff import jittered_backoff
from orchestrator.cluster.instance import instance_id, is_dead_here
from orchestrator.models import TaskHistory
from orchestrator.routing import stage_class, stage_queue
from orchestrator.runs import drain, retries, steps, terminal
from orchestrator.runs.context import RunContext
from orchestrator.runs.publish import publish_stage, stage_message_id
from orchestrator.runs.steps import StepStatus
from orchestrator.runs.watch import watching
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import broker, durable, live
from orchestrator.stores.durable import Stages
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind, TaskError
from tasks.pipeline import Stage
from tasks.policies import Retry

log = logging.getLogger(__name__)

# A message from a newer deploy goes back to the queue for a newer worker (as in the runner).
REQUEUE_PAUSE_S = 1.0
_ENDED = frozenset({StageState.COMPLETED.value, StageState.SKIPPED.value})


@dataclass(frozen=True)
class _Run:
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
        error = terminal.error_doc(ErrorKind.VALIDATION, str(exc))
        terminal.finish(
            definition, run.run_id, owner, RunState.FAILED, error=error, attempt=run.attempts
        )
        return
    states = run.stages or {name: StageState.WAITING.value for name in definition.stage_order}
    for name, state in states.items():
        if state == StageState.COMPLETED:
            # Reused by a resume (`reuse_completed`): the live hash, seeded with every stage
            # waiting, follows Postgres.
            _follow(run.run_id, name, StageState.ACTIVE)
            _follow(run.run_id, name, StageState.COMPLETED)
    pipeline_run = _Run(definition, run.run_id, owner, run.identity, run.priority, model)
    _advance(pipeline_run, Stages(states, run.results), ended=())


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
    run = _Run(definition, run_id, owner, identity, priority, model)
    moves = _advance(run, stages, ended=(), queued=queued)
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
    if _finish_discard(definition, run_id, error):
        return RunState.CANCELLED
    return RunState.CANCELLING


def run_stage_message(task_id: str, stage: str, run_id: str, processing_version: int) -> None:
    with durable.task_connections():
        _run_stage(registry.get()[task_id], stage, run_id, processing_version)


def _run_stage(definition: TaskDefinition, name: str, run_id: str, processing_version: int) -> None:
    if processing_version > definition.processing_version:
        time.sleep(REQUEUE_PAUSE_S)
        raise Reject(f"run {run_id}: stage {name} needs a newer worker", requeue=True)
    stage = definition.stage(name)
    claimed = durable.claim_stage(run_id, name, stage_class(definition, stage), instance_id())
    if claimed is None:
        # Its run is no longer active (ended, cancelling) or the stage is not waiting (this
        # message is a duplicate, or the run's end closed the stage, or its claimer died).
        log.info("run %s: stage %s not claimed; message dropped", run_id, name)
        _claim_refused(definition, run_id, stage)
        return
    _follow(run_id, name, StageState.ACTIVE)
    model = definition.input_model.model_validate(claimed.input)
    run = _Run(definition, run_id, claimed.owner, claimed.identity, claimed.priority, model)
    context = RunContext(run_id, model, task_id=definition.id, results=claimed.results, stage=name)
    attempt = _Attempt(run, stage, claimed.step, context)
    if processing_version < definition.processing_version:
        message = (
            f"enqueued for processing_version {processing_version}, "
            f"current is {definition.processing_version}"
        )
        _stage_failed(attempt, ErrorKind.STALE_VERSION, message)
        return
    try:
        with watching(_as_watched(definition, stage), run_id, claimed.owner, context):
            result = _keepable(stage.execute(context, model))
    except TaskError as exc:
        if exc.kind is ErrorKind.TRANSIENT and attempt.number < attempt.retry.max_attempts:
            _stage_retry(attempt, str(exc))
        else:
            _stage_failed(attempt, exc.kind, str(exc))
    except SoftTimeLimitExceeded:
        timeout = (stage.timeout or definition.timeout).soft
        _stage_failed(attempt, ErrorKind.TIMEOUT, f"passed its soft timeout of {timeout}")
    except _NotKeepable as exc:
        _stage_failed(attempt, ErrorKind.PERMANENT, str(exc))
    except Exception as exc:
        log.exception("run %s: stage %s raised", run_id, name)
        _stage_failed(
            attempt,
            ErrorKind.INTERNAL,
            f"{type(exc).__name__}: {exc}",
            traceback=terminal.traceback_tail(exc),
        )
    else:
        _stage_completed(attempt, result)


@dataclass(frozen=True)
class _Attempt:
    """One attempt of one stage: what its end writes on the stage's step record."""

    run: _Run
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

    def may_resume(self) -> bool:
        """Its worker lost, the stage may be tried again (`runs.resume`, for stages)."""
        return self.run.definition.retry_on_worker_loss and self.number < self.retry.max_attempts

    def ended(self, status: StepStatus, error: dict[str, Any] | None = None) -> dict[str, Any]:
        return steps.attempt_ended(self.step, self.context, status, timezone.now(), error)


def resume_dead_stage(definition: TaskDefinition, run_id: str, name: str) -> None:
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
    run = _Run(definition, run_id, owner, identity, priority, model)
    context = RunContext(run_id, model, task_id=definition.id)
    attempt = _Attempt(run, stage, record, context)
    message = f"its worker {claimer} stopped mid-stage"
    if attempt.may_resume():
        _stage_retry(attempt, message, ErrorKind.WORKER_LOST)
    else:
        _stage_failed(attempt, ErrorKind.WORKER_LOST, message)


def _finish_discard(
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


def _as_watched(definition: TaskDefinition, stage: Stage) -> TaskDefinition:
    """The definition the watchdogs judge a stage by: the stage's timeout, else the task's."""
    if stage.timeout is None:
        return definition
    return dataclasses.replace(definition, timeout=stage.timeout)


class _NotKeepable(Exception):
    pass


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


def _stage_failed(attempt: _Attempt, kind: ErrorKind, message: str, **extra: Any) -> None:
    """The stage fails, its step record first; then the run fails with the stage named."""
    name = attempt.stage.name
    if kind is ErrorKind.TRANSIENT and attempt.number > 1:
        message = retries.exhausted(message, attempt.number, attempt.retry.max_attempts)
    error = terminal.error_doc(kind, f"stage {name}: {message}", stage=name, **extra)
    step = attempt.ended(StepStatus.FAILED, error)
    _end_stage(attempt, StageState.FAILED, {"error": error}, step=step)


def _stage_retry(
    attempt: _Attempt,
    message: str,
    kind: ErrorKind = ErrorKind.TRANSIENT,
    *,
    stale_after_s: float | None = None,
) -> bool:
    """A TransientError (or a lost worker) with attempts left: the stage alone waits for its
    next attempt (active → waiting), with the stage's backoff, and its message is published
    again with that delay. The move is fenced by the attempt's claim and, with
    `stale_after_s`, by the run's heartbeat being still that old. Returns whether it moved
    (or waits in the drain to)."""
    run = attempt.run
    delay = jittered_backoff(attempt.retry, attempt.number)
    error = terminal.error_doc(
        kind,
        f"{message} ({retries.retrying(attempt.number, attempt.retry.max_attempts, delay)})",
    )
    then = {"delay_s": delay.total_seconds(), "kind": kind.value}
    step = attempt.ended(StepStatus.WAITING, error)
    if _end_stage(attempt, StageState.WAITING, then, step=step, stale_after_s=stale_after_s):
        return True
    _finish_discard(run.definition, run.run_id)
    return False


def _end_stage(attempt: _Attempt, target: StageState, then: dict[str, Any], **args: Any) -> bool:
    """An attempt's end: its stage's move in Postgres, fenced by the attempt's claim, then
    what follows it (`_stage_moved`, with `then`). A move Postgres refused on a transient error
    waits in the drain, which makes the same call once Postgres is back, then what follows;
    nothing of it reaches Valkey before. False when the move was refused as illegal."""
    run, name = attempt.run, attempt.stage.name
    call = {"stage": name, "cost": attempt.context.cost, "claimer": attempt.claimer, **args}
    ids = (run.run_id, name, target.value)
    try:
        stages = durable.move_stage(run.run_id, target=target, **call)
    except IllegalTransition as exc:
        log.info("run %s: stage %s %s not recorded (%s)", *ids, exc)
        return False
    except drain.TRANSIENT_ERRORS as exc:
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
    run: _Run, stage: Stage, target: StageState, stages: Stages, then: dict[str, Any]
) -> None:
    """What follows a stage's end once Postgres has it, from its writer or from the drain's
    replay (`_replayed`): the live hash follows; then the advance (completed), the run's
    failure with the stage's error (failed) or the stage's next message with the retry's
    delay (back to waiting)."""
    _follow(run.run_id, stage.name, target)
    if target == StageState.COMPLETED:
        _advance(run, stages, ended=(stage.name,))
    elif target == StageState.FAILED:
        terminal.finish(run.definition, run.run_id, run.owner, RunState.FAILED, error=then["error"])
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
    run = _Run(definition, entry.run_id, entry.owner, identity, priority, model)
    stage = definition.stage(entry.args["stage"])
    _stage_moved(run, stage, StageState(entry.target), stages, entry.then)


def resume_lost_stages(
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
    run = _Run(definition, run_id, owner, identity, priority, model)
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
    if not attempts or not all(attempt.may_resume() for attempt in attempts):
        return None
    moved = 0
    for index, attempt in enumerate(attempts):
        message = f"{why}; its worker {attempt.claimer or 'unknown'} was running it"
        # The first move stamps the run's heartbeat: the stale heartbeat is checked by it, the
        # later stages' moves are fenced by their claims alone.
        stale = stale_after_s if index == 0 else None
        if _stage_retry(attempt, message, ErrorKind.ORPHANED, stale_after_s=stale):
            moved += 1
        elif index == 0:
            return 0  # it moved on since it was judged: a heartbeat landed, or a stage ended
    return moved


def _advance(run: _Run, stages: Stages, ended: Iterable[str], queued: Collection[str] = ()) -> int:
    """Dispatch or skip the stages that the end of `ended` made due (with no `ended`: every
    waiting stage whose dependencies have all ended); end the run when no stage is left to
    run. `stages` is the run's stages as this process's last move left them; a stage whose
    message id is in `queued` is not published again. Returns how many moves it made."""
    definition = run.definition
    ended_now = set(ended)
    starting = not ended_now
    moves = 0
    for name in definition.stage_order:
        if stages.states.get(name) != StageState.WAITING:
            continue
        after = definition.stage(name).after
        due = starting or bool(ended_now.intersection(after))
        if not due or any(stages.states.get(dep) not in _ENDED for dep in after):
            continue
        try:
            reason = _skip_reason(run, name, stages)
        except Exception as exc:
            log.exception("run %s: `when` of stage %s raised", run.run_id, name)
            message = f"stage {name}: its `when` raised {type(exc).__name__}: {exc}"
            error = terminal.error_doc(ErrorKind.INTERNAL, message, stage=name)
            terminal.finish(definition, run.run_id, run.owner, RunState.FAILED, error=error)
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
        _follow(run.run_id, name, StageState.SKIPPED)
        ended_now.add(name)
        moves += 1
    if stages.states and all(state in _ENDED for state in stages.states.values()):
        terminal.finish(
            definition, run.run_id, run.owner, RunState.COMPLETED, result=stages.results
        )
        moves += 1
    return moves


@dataclass(frozen=True)
class ReusableRun:
    """What a resume reads of the run it resumes."""

    processing_version: int
    stages: dict[str, str]
    results: dict[str, Any]
    steps: dict[str, Any]


def _skip_reason(run: _Run, name: str, stages: Stages) -> str | None:
    stage = run.definition.stage(name)
    if stage.after and all(stages.states.get(dep) == StageState.SKIPPED for dep in stage.after):
        return "every stage it depends on was skipped"
    if stage.when is not None:
        context = RunContext(
            run.run_id, run.input, task_id=run.definition.id, results=stages.results
        )
        if not stage.when(context):
            return "its `when` said no"
    return None


def _follow(run_id: str, stage: str, target: StageState) -> None:
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
