"""`ctx.spawn` and `ctx.children` (issue 40): a step's children checked and admitted when the
handler spawns them, written with the step's end, given back when the step writes none; and
what a parent reads of them. The whole story is `runs.children`'s docstring."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from pydantic import ValidationError

from orchestrator.models import OnFailure, RunBatch, TaskHistory
from orchestrator.runs.batch import INPUT_CODES, Starts, admit_all
from orchestrator.runs.batches import Group, StartRequest, new_batch_id
from orchestrator.runs.handle import StartRefused
from orchestrator.states import RunState
from orchestrator.stores import durable, queries
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.context import ChildRun
from tasks.errors import PermanentError, TransientError
from tasks.policies import WhileActive
from tasks.registry import UnknownTaskError

log = logging.getLogger(__name__)

# The most children one step may spawn, over all its `spawn` calls.
MAX_CHILDREN = 10_000


@dataclass(frozen=True)
class Spawn:
    """One `spawn` call's children, admitted and not yet written."""

    starts: Starts
    on_failure: OnFailure


@dataclass(frozen=True)
class Parent:
    """The step spawning: its run, its stage ('' for a plain run), its run's priority, and
    whether a later stage awaits the children (known at the step's end)."""

    run_id: str
    stage: str
    priority: int | None
    awaited: bool = False


def spawn(
    parent: Parent,
    spawned: list[Spawn],
    task_id: str,
    inputs: Sequence[Mapping[str, Any]],
    on_failure: str,
    priority: int | None,
) -> list[str]:
    """`ctx.spawn`: check and admit the children, to be written with the step's end (`record`);
    their run ids (a child that joined a live run: that run's)."""
    try:
        mode = OnFailure(on_failure)
    except ValueError:
        raise PermanentError(
            f"spawn: on_failure {on_failure!r} is not one of {[m.value for m in OnFailure]}"
        ) from None
    already = sum(len(s.starts.requests) for s in spawned)
    if already + len(inputs) > MAX_CHILDREN:
        raise PermanentError(
            f"spawn: {already + len(inputs)} children in one step; at most {MAX_CHILDREN}"
        )
    try:
        definition = registry.get()[task_id]
    except UnknownTaskError as exc:
        raise PermanentError(f"spawn: {exc}") from None
    if definition.debounce is not None or definition.while_active is WhileActive.FOLLOW_UP:
        # Their starts write at once (`runs.coalesce`), not with the step's end.
        raise PermanentError(f"spawn: {task_id} coalesces its starts; a child cannot be one")
    for index, input_ in enumerate(inputs):
        try:
            definition.input_model.model_validate(input_)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "(input)"
            raise PermanentError(
                f"spawn: child {index} of {task_id}: field {field}: {first['msg']}"
            ) from None
    trigger = _trigger(parent.run_id, parent.stage)
    requests = [
        StartRequest(task_id, dict(input_), trigger=trigger, priority=priority) for input_ in inputs
    ]
    starts = admit_all(requests, atomic=True, priority=parent.priority)
    if starts.refused_all:
        index, refused = next((i, o) for i, o in enumerate(starts.answered()) if o.code is not None)
        message = f"spawn: child {index} of {task_id} refused: {refused.detail}"
        # Admission's refusals may pass (a quota, the circuit, a full queue); its input's not.
        raise PermanentError(message) if refused.code in INPUT_CODES else TransientError(message)
    spawned.append(Spawn(starts, mode))
    return [str(outcome.run_id) for outcome in starts.answered()]


def record(parent: Parent, spawned: Iterable[Spawn]) -> None:
    """The step's children written, in the transaction of the step's end: a batch per
    `spawn` call, its runs naming it and their parent."""
    for one in spawned:
        row = _batch_row(parent.run_id, parent.stage, one.on_failure.value, parent.awaited)
        _record(one.starts, Group(new_batch_id(), row, parent.run_id))


def reuse(run_id: str, original_id: str, stages: Iterable[str], priority: int | None) -> None:
    """A resume (`runs.rerun`), in its transaction: for each batch of children the original's
    reused `stages` spawned, a batch of the new run keeps the children that completed and
    starts the others again (same task, input and priority). StartRefused when one of those
    is refused: nothing is started."""
    batches = RunBatch.objects.filter(parent_run_id=original_id, parent_stage__in=list(stages))
    for batch in batches.order_by("created_at", "id"):
        reused_from = (batch.id, *batch.reused_from)
        kept = TaskHistory.objects.filter(
            batch_id__in=reused_from, state=RunState.COMPLETED
        ).count()
        again = (
            TaskHistory.objects.filter(batch_id=batch.id)
            .exclude(state=RunState.COMPLETED)
            .order_by("id")
            .values_list("task_id", "input", "priority")
        )
        trigger = _trigger(run_id, batch.parent_stage)
        requests = [StartRequest(t, i, trigger=trigger, priority=p) for t, i, p in again]
        starts = admit_all(requests, atomic=True, priority=priority)
        if starts.refused_all:
            refused = next(o for o in starts.answered() if o.code is not None)
            raise StartRefused(f"a child of stage {batch.parent_stage} refused: {refused.detail}")
        row = _batch_row(run_id, batch.parent_stage, batch.on_failure, batch.awaited)
        _record(starts, Group(new_batch_id(), row, run_id, reused_from, kept))


def _trigger(parent_run_id: str, stage: str) -> dict[str, str]:
    """A child's trigger document: its parent, and the stage that spawned it (if any)."""
    trigger = {"kind": TriggerKind.CHILD.value, "parentRunId": parent_run_id}
    if stage:
        trigger["stage"] = stage
    return trigger


def _batch_row(parent_run_id: str, stage: str, on_failure: str, awaited: bool) -> dict[str, Any]:
    """A batch of children's row (`insert_batch.sql`), but what its runs' count gives."""
    return {
        "parent_run_id": parent_run_id,
        "parent_stage": stage,
        "on_failure": on_failure,
        "awaited": awaited,
    }


def _record(starts: Starts, group: Group) -> None:
    if not starts.record(group):
        # Only a start with an idempotency key can lose it to a race; a child has none.
        raise RuntimeError(f"run {group.parent_run_id}: a child lost its key; nothing written")


@dataclass(frozen=True)
class Children:
    """A plain run's children, written with its end (`End.children`)."""

    parent: Parent
    spawned: list[Spawn]

    def write(self) -> None:
        record(self.parent, self.spawned)

    def abandon(self) -> None:
        abandon(self.spawned)


def abandon(spawned: Iterable[Spawn]) -> None:
    """A step that ends without writing its children: admission gives back what it took."""
    for one in spawned:
        one.starts.abandon()


def children_of(run_id: str, stage: str) -> list[ChildRun]:
    """`ctx.children(stage)`: every child the stage spawned, with its state, result and error.
    A result over LUMASTRA_STAGE_RESULT_MAX_BYTES comes as None, `result_omitted`."""
    cap = settings.CONFIG.stage_result_max_bytes
    with connection.cursor() as cursor:
        cursor.execute(queries.CHILDREN_OF, {"parent_run_id": run_id, "stage": stage, "cap": cap})
        return [
            ChildRun(
                run_id=child_id,
                task_id=task_id,
                input=durable.json_value(input_),
                state=state,
                result=durable.json_value(result) if not omitted else None,
                error=durable.json_value(error),
                result_omitted=omitted,
            )
            for child_id, task_id, input_, state, result, error, omitted in cursor.fetchall()
        ]
