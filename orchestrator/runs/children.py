"""Child runs and batches (issue 40): work that fans out, and what waits for it.

`ctx.spawn(task_id, inputs)` in a handler or a stage checks every input (a bad one fails the
step, naming its index and field, before anything is written) and admits each child as
`start_runs` would (quotas, the circuit, backpressure, identity); the handler gets the
children's run ids at once. Nothing is written then: the children are recorded by one INSERT
(`runs.batch`), with their batch's row (`models.RunBatch`), in the transaction of the step's
own end (`record`): the stage's move, or a plain run's end. So a crash never leaves children
without their parent's record of them, or the reverse. A step that fails, or is tried again,
writes none: what admission took for them is given back (`abandon`). Each `spawn` call is one
batch; a child that joined a live run of its identity is answered with that run's id and is not
the parent's (its end is not waited for).

A child is an ordinary run of its own task (`trigger.kind` "child", its parent's priority unless
given), naming its parent (`parent_run_id`) and its batch; the batch names the spawning stage.

Each end of a batch's run is counted on the batch's row by a trigger on task_history
(`count_batch_end.sql`), in the end's own transaction, whichever path ends it (a worker, a
cancel, the orphan check, the drain's replay): a run leaves the live states once, so a
duplicate end cannot count twice, and the batch's row lock makes exactly one end see the last.
The batch is then done (or at the first child that did not complete, for `on_failure=
"fail_parent"`), and the leader's `batches` loop (`release_when_done`: woken by the trigger's
notification at the end's commit, and looking every LUMASTRA_DUE_POLL_S besides) acts on it
once (`released_at`): a batch's callbacks (`runs.batch.Batch`) are started in the same
transaction as that mark, so they start once; a parent's stage that awaits the children
(`Stage(await_children=True)`) is made due by the parent's advance (`runs.pipeline`), which asks
`settled` whether every child of its dependencies has ended. A failure of a `fail_parent` child
fails the parent run, naming the stage that awaited it, and cancels the batch's live children.

A parent that ends failed or cancelled takes its live children with it: its cancel asks
every live descendant at once (`runs.cancel.cancel_descendants`), a `fail_parent` failure too,
and the reconciler's `children` chore (`recovery.children`) cancels those they missed. A
parent's stage that completes while its run is being cancelled writes no children. A child of a
parent that completed runs on: a plain handler's children outlive it by design. A resume keeps
the children that completed (`runs.spawn.reuse`), and is refused while the original has live
children. A task that coalesces its starts (debounce, follow-up) cannot be spawned: its starts
write at once, not with the step's end.

Not guaranteed: admission's identity holds are provisional until the step's end commits
(LUMASTRA_IDENTITY_PROVISIONAL_TTL_S, 30 s): a step that ends later than that after its spawn
may meet a second run of a child's identity, started meanwhile, and a crash keeps them held
that long; a step whose end Postgres refused on a transient error is not drained (its children
cannot wait in Valkey): it is found lost and tried again. A callback that admission refuses at
the release (a quota, an open circuit, a full queue) is recorded as refused
(`GET /batches/{id}`), not tried again; a batch that recorded no run starts none. A parent
advanced twice (the release and a recovery at once) publishes its due stage twice; the stage's
claim takes one. `fail_parent` fails a parent that is still running (a pipeline waiting for
its children); a plain run has ended before its children.
"""

from __future__ import annotations

import json
import logging
import select
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from orchestrator.cluster.locks import Fence
from orchestrator.models import OnFailure, RunBatch, TaskHistory
from orchestrator.runs import retries, terminal
from orchestrator.runs.batch import start_runs
from orchestrator.runs.batches import StartRequest, callback_input, request_of
from orchestrator.runs.cancel import cancel_descendants
from orchestrator.runs.pipeline import PipelineRun, advance
from orchestrator.states import LIVE_RUN_STATES, RunState
from orchestrator.stores import durable, queries
from orchestrator.stores.durable import Stages
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

# Batches one release looks at; more wait for the next tick.
RELEASE_BATCH = 100


@dataclass(frozen=True)
class ChildBatch:
    """One batch a run's step spawned, as its page shows it."""

    batch_id: str
    stage: str
    total: int
    ended: int
    counts: dict[str, int]  # its ended runs by state

    @property
    def says(self) -> str:
        return f"{self.ended} of {self.total} done"


def batches_of(run_id: str) -> list[ChildBatch]:
    """The batches of children a run's steps spawned, oldest first (their counts, kept by the
    trigger: no read of the children themselves)."""
    rows = RunBatch.objects.filter(parent_run_id=run_id).order_by("created_at", "id")
    return [
        ChildBatch(row.id, row.parent_stage, row.total, row.total - row.open, row.counts)
        for row in rows
    ]


# Where the trigger announces a batch done (count_batch_end.sql), at its commit.
DONE_CHANNEL = "lumastra_batch_done"


def release_when_done(fence: Fence | None = None, wait_s: float = 0.25) -> int:
    """The leader's `batches` loop's tick: `release`, then, if nothing was done, wait up to
    `wait_s` for the trigger's notification that a batch is done and release it at once. It
    listens only within the tick (LISTEN, UNLISTEN): a process that stops leading leaves no
    listener that nobody reads (Postgres's notification queue would fill behind it). A
    notification between two ticks is not lost: the next tick's `release` reads the batch."""
    raw = _listening()
    try:
        released = release(fence)
        if not released and _notified(raw, wait_s):
            released = release(fence)
        return released
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"UNLISTEN {DONE_CHANNEL}")


def _listening() -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"LISTEN {DONE_CHANNEL}")
    return connection.connection


def _notified(raw: Any, wait_s: float) -> bool:
    """Whether a notification came within `wait_s` (each is read and dropped: the release
    reads what is done)."""
    if not raw.notifies:
        ready, _, _ = select.select([raw], [], [], wait_s)
        if ready:
            raw.poll()
    heard = bool(raw.notifies)
    raw.notifies.clear()
    return heard


def release(fence: Fence | None = None, limit: int = RELEASE_BATCH) -> int:
    """The leader's `batches` loop: act once on each batch done since the last look (see the
    module's docstring); returns how many it released."""
    if fence is not None:
        fence.check()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(queries.RELEASE_BATCHES, {"limit": limit})
            rows = cursor.fetchall()
        for batch_id, _, _, _, counts, on_complete, on_success, total in rows:
            if total and (on_complete is not None or on_success is not None):
                _start_callbacks(
                    batch_id,
                    durable.json_value(counts),
                    durable.json_value(on_complete),
                    durable.json_value(on_success),
                )
    for batch_id, parent_run_id, stage, on_failure, counts, _, _, _ in rows:
        if parent_run_id is None:
            continue
        failed = on_failure == OnFailure.FAIL_PARENT and ended_otherwise(durable.json_value(counts))
        try:
            wake_parent(parent_run_id, stage, failed_batch=batch_id if failed else None)
        except Exception:
            # The parent stays where it is; the stalled-pipeline recovery moves it on.
            log.exception("run %s: not moved on after its batch %s", parent_run_id, batch_id)
    return len(rows)


def _start_callbacks(
    batch_id: str,
    counts: dict[str, int],
    on_complete: Mapping[str, Any] | None,
    on_success: Mapping[str, Any] | None,
) -> None:
    """A done batch's callbacks, started in the transaction that marks it released, each in a
    savepoint: one that fails (its task no longer registered) is recorded as an error, and the
    release goes on. A callback admission refuses (a quota, an open circuit, a full queue) is
    recorded as refused, not tried again."""
    callbacks = {"on_complete": on_complete}
    if not ended_otherwise(counts):
        callbacks["on_success"] = on_success
    started: dict[str, Any] = {}
    for name, doc in callbacks.items():
        if doc is None:
            continue
        request = request_of(doc)
        request = StartRequest(
            request.task_id,
            callback_input(request, batch_id, counts),
            trigger=request.trigger,
            priority=request.priority,
        )
        try:
            with transaction.atomic():
                (outcome,) = start_runs([request])
        except Exception as exc:
            log.exception("batch %s: its %s callback failed to start", batch_id, name)
            started[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        started[name] = outcome.run_id if outcome.run_id else {"refused": outcome.detail}
        if outcome.run_id is None:
            log.error("batch %s: its %s callback was refused: %s", batch_id, name, outcome.detail)
    with connection.cursor() as cursor:
        cursor.execute(queries.BATCH_CALLBACKS, {"id": batch_id, "callbacks": json.dumps(started)})


def ended_otherwise(counts: Mapping[str, int]) -> bool:
    """A batch's counts by end state (`run_batches.counts`) hold a run that did not complete."""
    return bool(set(counts) - {RunState.COMPLETED.value})


def wake_parent(parent_run_id: str, stage: str, *, failed_batch: str | None = None) -> None:
    """A batch of the parent's `stage` is done: advance the parent (its stages that await the
    children may be due now), or, when a `fail_parent` child did not complete, fail it."""
    found = (
        TaskHistory.objects.filter(id=parent_run_id, state=RunState.ACTIVE)
        .values_list(
            "task_id",
            "stages",
            "stage_results",
            "input",
            "owner_instance_id",
            "identity",
            "priority",
        )
        .first()
    )
    if found is None:
        return  # ended meanwhile, or a plain run: nothing waits
    task_id, states, results, input_, owner, identity, priority = found
    definition = registry.get().get(task_id)
    if definition is None or not definition.pipeline:
        return
    if failed_batch is not None:
        _fail_parent(definition, parent_run_id, owner, stage, failed_batch)
        return
    model = definition.input_model.model_validate(input_)
    run = PipelineRun(definition, parent_run_id, owner, identity, priority, model)
    advance(run, Stages(states, results), ended=(stage,))


def fail_if_a_child_failed(definition: TaskDefinition, run_id: str, owner: str) -> bool:
    """A stalled parent (`recovery.stages`) whose `fail_parent` child did not complete, the
    release that fails it lost: it fails now. Says whether it did."""
    found = next(
        (
            (batch.id, batch.parent_stage)
            for batch in RunBatch.objects.filter(
                parent_run_id=run_id, on_failure=OnFailure.FAIL_PARENT
            ).exclude(done_at=None)
            if ended_otherwise(batch.counts)
        ),
        None,
    )
    if found is None:
        return False
    _fail_parent(definition, run_id, owner, found[1], found[0])
    return True


def _fail_parent(
    definition: TaskDefinition, run_id: str, owner: str, stage: str, batch_id: str
) -> None:
    """A `fail_parent` child did not complete: the parent fails, naming the stage that awaited
    it, and the batch's live children are cancelled."""
    failed = (
        TaskHistory.objects.filter(batch_id=batch_id)
        .exclude(state__in=[*LIVE_RUN_STATES, RunState.COMPLETED])
        .values_list("id", "state")
        .first()
    )
    waiting = definition.awaiting(stage)
    named = waiting[0] if waiting else stage
    child = f"run {failed[0]} ({failed[1]})" if failed else "a child"
    message = f"stage {named}: {child}, a child of stage {stage}, did not complete"
    error = retries.error_doc(ErrorKind.CHILD_FAILED, message, stage=named)
    terminal.end(definition, run_id, owner, RunState.FAILED, error=error)
    # The parent has failed: the rest of its children go with it, at any depth.
    cancel_descendants(run_id, f"the failure of its ancestor {run_id}")
