"""Batches of runs (`models.RunBatch`): what one start asks (`StartRequest`), a caller's batch
and its callbacks (`Batch`), and the batch's row, written with its runs (`Group`, by
`runs.batch`). `runs.children` says how a batch's ends are counted and its callbacks started."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
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


def new_batch_id() -> str:
    return f"batch_{ULID()}"


@dataclass(frozen=True)
class Group:
    """The batch the recorded runs belong to (`models.RunBatch`), written with them; a spawned
    child's `parent_run_id` too."""

    batch_id: str
    row: dict[str, Any]  # insert_batch.sql's parameters but `open` and `total`
    parent_run_id: str | None = None


@dataclass(frozen=True)
class Batch:
    """`start_runs(..., batch=Batch(...))`: once every run the batch recorded has ended,
    `on_complete` starts, and `on_success` too when every one completed. Each callback's input
    is its request's with `batch_id` and `counts` (the runs by their end state) added."""

    on_complete: StartRequest | None = None
    on_success: StartRequest | None = None

    def check(self) -> None:
        """A callback that could not start is refused now (InvalidInput, UnknownTaskError)."""
        for request in (self.on_complete, self.on_success):
            if request is not None:
                prepare(
                    request.task_id,
                    callback_input(request, "batch_", {}),
                    trigger=request.trigger,
                    priority=request.priority,
                )

    def group(self, batch_id: str) -> Group:
        return Group(
            batch_id,
            {
                "parent_run_id": None,
                "parent_stage": "",
                "on_failure": "continue",
                "on_complete": _request_doc(self.on_complete),
                "on_success": _request_doc(self.on_success),
            },
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


def insert_batch(group: Group, total: int, ended: int) -> None:
    """The batch's row: `total` runs recorded, `ended` of them recorded ended (done at once when
    none is open)."""
    params = {**group.row, "id": group.batch_id, "total": total, "open": total - ended}
    params["counts"] = json.dumps({RunState.CANCELLED.value: ended} if ended else {})
    with connection.cursor() as cursor:
        cursor.execute(queries.INSERT_BATCH, params)
