"""Batches of runs (`models.RunBatch`): what one start asks (`StartRequest`), a caller's batch
and its callbacks (`Batch`), and the batch's row, written with its runs (`Group`, by
`runs.batch`). `runs.children` says how a batch's ends are counted and its callbacks started."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from ulid import ULID

from orchestrator.runs.start import prepare
from orchestrator.states import RunState
from orchestrator.stores import queries
from orchestrator.triggers import TriggerKind


@dataclass(frozen=True)
class StartRequest:
    """One start of a batch: `start_run`'s arguments."""

    task_id: str
    input: Mapping[str, Any] | None = None
    trigger: TriggerKind | Mapping[str, Any] = TriggerKind.MANUAL
    priority: int | None = None
    idempotency_key: str | None = None
    not_before: datetime | timedelta | None = None
    tags: tuple[str, ...] = ()


def new_batch_id() -> str:
    return f"batch_{ULID()}"


@dataclass(frozen=True)
class Group:
    """The batch the recorded runs belong to (`models.RunBatch`), written with them; a spawned
    child's `parent_run_id` too."""

    batch_id: str
    row: dict[str, Any]  # insert_batch.sql's parameters but the counts
    parent_run_id: str | None = None
    # A resume's batch: the original batches whose completed runs it keeps, and how many.
    reused_from: tuple[str, ...] = ()
    kept: int = 0


@dataclass(frozen=True)
class Batch:
    """`start_runs(..., batch=Batch(...))`: once every run the batch recorded has ended,
    `on_complete` starts, and `on_success` too when every one completed. Each callback's input
    is its request's with `batch_id` and `counts` (the runs by their end state) added."""

    on_complete: StartRequest | None = None
    on_success: StartRequest | None = None
    id: str = field(default_factory=lambda: new_batch_id())  # `GET /api/v1/batches/{id}`

    def check(self) -> None:
        """A callback that could not start is refused now (InvalidInput, UnknownTaskError)."""
        for request in (self.on_complete, self.on_success):
            if request is not None:
                check_callback(request)

    def group(self) -> Group:
        return Group(
            self.id,
            {
                "on_complete": _request_doc(self.on_complete),
                "on_success": _request_doc(self.on_success),
            },
        )


def check_callback(request: StartRequest) -> None:
    """Refuses (as `start_run` would) a callback that could not start with the input it gets."""
    prepare(
        request.task_id,
        callback_input(request, new_batch_id(), {}),
        trigger=request.trigger,
        priority=request.priority,
    )


def callback_input(
    request: StartRequest, batch_id: str, counts: Mapping[str, int]
) -> dict[str, Any]:
    return {**(request.input or {}), "batch_id": batch_id, "counts": dict(counts)}


def _request_doc(request: StartRequest | None) -> str | None:
    if request is None:
        return None
    trigger = request.trigger
    doc = {
        "task_id": request.task_id,
        "input": dict(request.input or {}),
        "trigger": trigger.value if isinstance(trigger, TriggerKind) else dict(trigger),
        "priority": request.priority,
    }
    return json.dumps(doc)


def request_of(doc: Mapping[str, Any]) -> StartRequest:
    trigger = doc["trigger"]
    return StartRequest(
        doc["task_id"],
        doc["input"],
        trigger=TriggerKind(trigger) if isinstance(trigger, str) else trigger,
        priority=doc["priority"],
    )


def insert_batch(group: Group, recorded: int, ended: int) -> None:
    """The batch's row: `recorded` runs, `ended` of them recorded ended, beside the runs a
    resume keeps (`Group.kept`); done at once when none is open."""
    counts = {RunState.CANCELLED.value: ended, RunState.COMPLETED.value: group.kept}
    params = {
        "parent_run_id": None,
        "parent_stage": "",
        "on_failure": "continue",
        "awaited": False,
        "on_complete": None,
        "on_success": None,
        **group.row,
        "id": group.batch_id,
        "total": recorded + group.kept,
        "open": recorded - ended,
        "counts": json.dumps({state: n for state, n in counts.items() if n}),
        "reused_from": list(group.reused_from),
    }
    params["done"] = params["open"] == 0 or (params["on_failure"] == "fail_parent" and ended > 0)
    with connection.cursor() as cursor:
        cursor.execute(queries.INSERT_BATCH, params)
