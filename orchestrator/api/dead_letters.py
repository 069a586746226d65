"""`/dead-letters` and `/drain/poison`: what stopped being retried, as the console's Dead
letters page lists it, and the operator's actions on it.

- `GET /dead-letters?kind=&task=`: the engine's dead letters, a kind at a time in the page's
  order (exhausted runs, drain poison, dead webhook deliveries), newest first within a kind;
  follow `next_cursor` until it is null. `task` keeps those of one task's runs.
- `POST /dead-letters/requeue {"kind", "ids"}`: requeue one or many, with an outcome per id:
  an exhausted run is rerun (`runs.rerun`: a new run at priority 1; a pipeline resumes), a
  poison entry is replayed (`recovery.drain_poison`), a dead delivery is sent again
  (`webhooks.delivery.redeliver`).
- `GET /drain/poison`, `POST /drain/poison/replay`, `POST /drain/poison/discard`: the drain's
  poison list in full (each entry's write, its run's state now, whether it can be replayed).

Reads need view, actions operate. The read and act functions are the console's own; nothing
here writes a run, a drain entry or a delivery. The coverage outbox's dead letters are the
catalog's (`GET /coverage/outbox/dead-letters`, `coverage/outbox_api.py`), not listed here: the
engine never imports the catalog.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from django.db.models import Subquery
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import BeforeValidator, ConfigDict, StringConstraints, WithJsonSchema

from orchestrator.api.auth import OPERATE, VIEW, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.fields import Storable, StorableStr
from orchestrator.api.pagination import Position, decode_cursor, encode_cursor, page
from orchestrator.hooks.base import Refused
from orchestrator.models import TaskHistory
from orchestrator.recovery import drain_poison
from orchestrator.runs.cancel import UnknownRun
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.rerun import dead_letters, requeued_as, rerun
from orchestrator.text import is_ascii_digits
from orchestrator.webhooks import delivery
from tasks.registry import UnknownTaskError

router = Router(tags=["dead letters"])

MAX_PAGE = 200
MAX_IDS = 200


class Kind(StrEnum):
    EXHAUSTED_RUN = "exhausted_run"  # a run that failed after its last attempt
    DRAIN_POISON = "drain_poison"  # a terminal write Postgres kept refusing
    WEBHOOK_DELIVERY = "webhook_delivery"  # a delivery that failed every attempt


class DeadLetterOut(Schema):
    kind: Kind
    id: str = Field(description="what POST /dead-letters/requeue takes, with the kind")
    task: str | None = Field(description="the task of its run, when known")
    run_id: str | None
    at: datetime | None = Field(
        description="a run's or delivery's creation; a poison entry's poisoning"
    )
    attempts: int
    error: str
    requeueable: bool = Field(description="false: an unreadable poison entry (discard only)")
    requeued_as: list[str] = Field(description="an exhausted run's reruns so far")


class DeadLetterPage(Schema):
    items: list[DeadLetterOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


def _encode(kind: Kind, after: str | None) -> str:
    return encode_cursor([kind.value, after])


def _decode(value: object) -> object:
    """(kind, that kind's position) from a cursor: checked as any input, since it comes back
    from the client; a position that is not the kind's own is refused, not read."""
    if not isinstance(value, str):
        return value
    try:
        kind, after = decode_cursor(value)
        kind = Kind(kind)
        if after is not None:
            _CHECKS[kind](after)
    except (TypeError, ValueError):
        raise ValueError("not a cursor from a previous page") from None
    return Resume(kind, after)


@dataclass(frozen=True)
class Resume:
    """Where a page stopped: a kind, and that kind's own position (None: its start)."""

    kind: Kind
    after: str | None


def _poison_position(after: str) -> tuple[str, str]:
    poisoned_at, bar, record_id = after.partition("|")
    if not (bar and poisoned_at and re.fullmatch("[0-9a-f]{40}", record_id)):
        raise ValueError(after)
    return poisoned_at, record_id


def _delivery_id(text: str) -> int | None:
    # Longer digit strings overflow the bigint Postgres compares them with: they name nothing.
    return int(text) if is_ascii_digits(text) and len(text) <= 18 else None


def _delivery_position(after: str) -> int:
    position = _delivery_id(after)
    if position is None:
        raise ValueError(after)
    return position


_CHECKS: dict[Kind, Callable[[str], object]] = {
    Kind.EXHAUSTED_RUN: Position.decode,
    Kind.DRAIN_POISON: _poison_position,
    Kind.WEBHOOK_DELIVERY: _delivery_position,
}

# A cursor is where the last page stopped: a kind and that kind's own position in it.
Cursor = Annotated[
    Resume | None,
    BeforeValidator(_decode),
    WithJsonSchema({"type": "string", "description": "next_cursor of the previous page"}),
]


class DeadLetterFilters(Schema):
    kind: Kind | None = Field(None, description="one kind only; absent: every kind")
    task: StorableStr | None = None
    cursor: Cursor = None
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)


Ids = Annotated[
    list[Annotated[str, StringConstraints(min_length=1, max_length=64), Storable()]],
    Field(min_length=1, max_length=MAX_IDS),
]


class RequeueIn(Schema):
    model_config = ConfigDict(extra="forbid")

    kind: Kind
    ids: Ids = Field(description=f"at most {MAX_IDS}, as the list gives them")


class PoisonIdsIn(Schema):
    model_config = ConfigDict(extra="forbid")

    ids: Ids = Field(description=f"poison record ids (`id`), at most {MAX_IDS}")


class Outcome(Schema):
    id: str
    outcome: Literal["requeued", "replayed", "discarded", "not_found", "refused"]
    detail: str
    run_id: str | None = Field(default=None, description="the new run, or the run it concerns")


class Outcomes(Schema):
    results: list[Outcome] = Field(description="one per id, in the order given")


class PoisonOut(Schema):
    id: str = Field(description="the record's id, for replay and discard")
    run_id: str | None
    write: str = Field(description="the write Postgres refused (a run's end, a stage move)")
    attempts: int
    error: str
    poisoned_at: str
    replayable: bool = Field(description="false: the entry is unreadable (discard only)")
    run_state: str | None = Field(description="the run's state now; null: no such run")


# --- reading, a kind at a time -------------------------------------------------------------

Page = tuple[list[DeadLetterOut], str | None]


def _exhausted(task: str | None, after: str | None, limit: int) -> Page:
    runs = dead_letters() if task is None else dead_letters().filter(task_id=task)
    rows, following = page(runs, Position.decode(after) if after else None, limit)
    reruns = requeued_as(r.id for r in rows) if rows else {}
    return [
        DeadLetterOut(
            kind=Kind.EXHAUSTED_RUN,
            id=r.id,
            task=r.task_id,
            run_id=r.id,
            at=r.created_at,
            attempts=r.attempts,
            error=str((r.error or {}).get("message", "")),
            requeueable=True,
            requeued_as=reruns.get(r.id, []),
        )
        for r in rows
    ], following.encode() if following else None


def _poison(task: str | None, after: str | None, limit: int) -> Page:
    entries = _poison_list(task)
    if after is not None:
        position = _poison_position(after)
        entries = [e for e in entries if (e.poisoned_at, e.record_id) < position]
    shown = entries[:limit]
    tasks = _tasks_of([e.run_id for e in shown])
    items = [
        DeadLetterOut(
            kind=Kind.DRAIN_POISON,
            id=e.record_id,
            task=tasks.get(e.run_id),
            run_id=e.run_id or None,
            at=datetime.fromisoformat(e.poisoned_at) if e.poisoned_at else None,
            attempts=e.attempts,
            error=e.error,
            requeueable=e.replayable,
            requeued_as=[],
        )
        for e in shown
    ]
    more = len(entries) > limit
    return items, f"{shown[-1].poisoned_at}|{shown[-1].record_id}" if more else None


def _poison_list(task: str | None) -> list[drain_poison.PoisonedEntry]:
    """The whole list (at most POISON_CAP), newest first by (poisoned_at, record id)."""
    entries = drain_poison.poisoned(drain_poison.POISON_CAP)
    if task is not None:
        tasks = _tasks_of([e.run_id for e in entries])
        entries = [e for e in entries if tasks.get(e.run_id) == task]
    return sorted(entries, key=lambda e: (e.poisoned_at, e.record_id), reverse=True)


def _tasks_of(run_ids: list[str]) -> dict[str, str]:
    ids = [r for r in run_ids if r]
    if not ids:
        return {}
    return dict(TaskHistory.objects.filter(id__in=ids).values_list("id", "task_id"))


def _webhooks(task: str | None, after: str | None, limit: int) -> Page:
    dead = delivery.dead()
    if task is not None:
        runs = TaskHistory.objects.filter(task_id=task).values("id")
        dead = dead.filter(run_id__in=Subquery(runs))
    if after is not None:
        dead = dead.filter(id__lt=_delivery_position(after))
    rows = list(dead.order_by("-id")[: limit + 1])
    tasks = _tasks_of([d.run_id for d in rows[:limit]])
    items = [
        DeadLetterOut(
            kind=Kind.WEBHOOK_DELIVERY,
            id=str(d.pk),
            task=tasks.get(d.run_id),
            run_id=d.run_id or None,
            at=d.created_at,
            attempts=d.attempts,
            error=d.last_error,
            requeueable=True,
            requeued_as=[],
        )
        for d in rows[:limit]
    ]
    return items, str(rows[limit - 1].pk) if len(rows) > limit else None


_READERS: dict[Kind, Callable[[str | None, str | None, int], Page]] = {
    Kind.EXHAUSTED_RUN: _exhausted,
    Kind.DRAIN_POISON: _poison,
    Kind.WEBHOOK_DELIVERY: _webhooks,
}


@router.get("/dead-letters", auth=VIEW, response=answers({200: DeadLetterPage}, 422))
def list_dead_letters(request: HttpRequest, filters: Query[DeadLetterFilters]) -> DeadLetterPage:
    """A kind at a time (exhausted runs, drain poison, webhook deliveries), newest first."""
    kinds = list(Kind) if filters.kind is None else [filters.kind]
    start, after = (
        (filters.cursor.kind, filters.cursor.after) if filters.cursor else (kinds[0], None)
    )
    if start not in kinds:
        detail = f"the cursor is for kind {start.value}, not {filters.kind}"
        raise ApiError(422, detail, [{"loc": ["query", "cursor"], "msg": detail}])
    items: list[DeadLetterOut] = []
    for kind in kinds[kinds.index(start) :]:
        left = filters.limit - len(items)
        if left == 0:
            return DeadLetterPage(items=items, next_cursor=_encode(kind, None))
        found, following = _READERS[kind](filters.task, after, left)
        items += found
        after = None
        if following is not None:
            return DeadLetterPage(items=items, next_cursor=_encode(kind, following))
    return DeadLetterPage(items=items, next_cursor=None)


# --- acting, one id at a time, each with its outcome ---------------------------------------


def _requeue_run(run_id: str, actor: str) -> Outcome:
    if not dead_letters().filter(id=run_id).exists():
        return Outcome(id=run_id, outcome="not_found", detail=f"no exhausted run {run_id!r}")
    try:
        handle = rerun(run_id, actor=actor)
    except (StartRefused, Refused, UnknownRun, UnknownTaskError) as exc:
        # UnknownTaskError: its task is no longer registered; nothing was started.
        return Outcome(id=run_id, outcome="refused", detail=str(exc))
    return Outcome(
        id=run_id,
        outcome="requeued",
        detail=f"requeued as run {handle.run_id}",
        run_id=handle.run_id,
    )


def _replay(record_id: str, actor: str) -> Outcome:
    try:
        entry = drain_poison.replay_poisoned(record_id)
    except drain_poison.PoisonGone as exc:
        return Outcome(id=record_id, outcome="not_found", detail=str(exc))
    except (drain_poison.NotReplayable, drain_poison.DrainFull) as exc:
        return Outcome(id=record_id, outcome="refused", detail=str(exc))
    detail = f"the {entry.target} write of run {entry.run_id} is back on the drain"
    return Outcome(id=record_id, outcome="replayed", detail=detail, run_id=entry.run_id or None)


def _discard(record_id: str, actor: str) -> Outcome:
    try:
        entry = drain_poison.discard_poisoned(record_id)
    except drain_poison.PoisonGone as exc:
        return Outcome(id=record_id, outcome="not_found", detail=str(exc))
    detail = f"the {entry.target} write of run {entry.run_id or '(unreadable)'} is discarded"
    return Outcome(id=record_id, outcome="discarded", detail=detail, run_id=entry.run_id or None)


def _redeliver(delivery_id: str, actor: str) -> Outcome:
    pk = _delivery_id(delivery_id)
    if pk is None or not delivery.dead().filter(id=pk).exists():
        detail = f"no dead webhook delivery {delivery_id!r}"
        return Outcome(id=delivery_id, outcome="not_found", detail=detail)
    if not delivery.redeliver([pk]):
        return Outcome(id=delivery_id, outcome="refused", detail="it is being sent right now")
    return Outcome(id=delivery_id, outcome="requeued", detail="to be sent again now")


_REQUEUE: dict[Kind, Callable[[str, str], Outcome]] = {
    Kind.EXHAUSTED_RUN: _requeue_run,
    Kind.DRAIN_POISON: _replay,
    Kind.WEBHOOK_DELIVERY: _redeliver,
}


def _each(ids: list[str], act: Callable[[str, str], Outcome], request: HttpRequest) -> Outcomes:
    actor = current_user(request).username
    return Outcomes(results=[act(i, actor) for i in dict.fromkeys(ids)])


@router.post("/dead-letters/requeue", auth=OPERATE, response=answers({200: Outcomes}, 422))
def requeue(request: HttpRequest, letters: RequeueIn) -> Outcomes:
    """Requeue each id of one kind; the answer has an outcome per id (a repeated id once)."""
    return _each(letters.ids, _REQUEUE[letters.kind], request)


@router.get("/drain/poison", auth=VIEW, response=answers({200: list[PoisonOut]}))
def list_poison(request: HttpRequest) -> list[PoisonOut]:
    """The whole poison list (at most 10,000 entries), newest first."""
    entries = _poison_list(None)
    states = dict(
        TaskHistory.objects.filter(id__in=[e.run_id for e in entries if e.run_id]).values_list(
            "id", "state"
        )
    )
    return [
        PoisonOut(
            id=e.record_id,
            run_id=e.run_id or None,
            write=e.target,
            attempts=e.attempts,
            error=e.error,
            poisoned_at=e.poisoned_at,
            replayable=e.replayable,
            run_state=states.get(e.run_id),
        )
        for e in entries
    ]


@router.post("/drain/poison/replay", auth=OPERATE, response=answers({200: Outcomes}, 422))
def replay(request: HttpRequest, records: PoisonIdsIn) -> Outcomes:
    """Put each entry back on the drain, attempts from zero (once its cause is fixed)."""
    return _each(records.ids, _replay, request)


@router.post("/drain/poison/discard", auth=OPERATE, response=answers({200: Outcomes}, 422))
def discard(request: HttpRequest, records: PoisonIdsIn) -> Outcomes:
    """Forget each entry for good (it is logged first)."""
    return _each(records.ids, _discard, request)
