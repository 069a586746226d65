"""`start_run`: the one entry point that creates runs.

Write order: INSERT task_history → seed the live hash (Lua) → enqueue. The insert joins the
caller's transaction (without one, it commits by itself); seeding and publishing happen on
commit, so the run exists if and only if that transaction commits, and no message ever names a
run Postgres does not have. A crash between commit and publish leaves a `pending` row for the
reconciler. A keyed-concurrency task's run is published when its key's turn comes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from pydantic import BaseModel, ValidationError
from ulid import ULID

from orchestrator import tracing
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks import keyed
from orchestrator.hooks.base import Admission, Deduplicated, Dropped, Throttled
from orchestrator.models import TaskHistory
from orchestrator.runs import coalesce
from orchestrator.runs import shed as shed_runs
from orchestrator.runs.admission import admit
from orchestrator.runs.coalesce import LiveRun
from orchestrator.runs.due import due_time
from orchestrator.runs.handle import InvalidInput, KeyContended, RunHandle, StartRefused, answered
from orchestrator.runs.publish import carried, publish, publish_turns
from orchestrator.runs.tags import checked as checked_tags
from orchestrator.states import RunState, StageState
from orchestrator.stores import durable, live, queries
from orchestrator.stores.broker import job_id
from orchestrator.text import first_unstorable, unstorable
from orchestrator.triggers import PRIORITY_BY_TRIGGER, TriggerKind
from tasks import registry
from tasks.definition import Priority, TaskDefinition
from tasks.errors import ErrorKind
from tasks.policies import WhileActive

log = logging.getLogger(__name__)

# Inserts tried while the runs holding the idempotency key end before they can be read.
_KEY_RACE_ATTEMPTS = 5
# A bound on the key keeps it well inside what the unique index on it can hold.
MAX_IDEMPOTENCY_KEY = 200


def new_run_id() -> str:
    return f"run_{ULID()}"


def validate_input(definition: TaskDefinition, data: object) -> BaseModel:
    """The input as the task's model normalises it, or InvalidInput with field errors."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise InvalidInput(definition.id, [{"loc": [], "msg": "input must be a JSON object"}])
    # Before the task's model: its validators need not meet text no store will take.
    if found := _unstorable_in(data):
        loc, reason = found
        raise InvalidInput(definition.id, [{"loc": loc, "msg": reason, "type": "unstorable_text"}])
    try:
        return definition.input_model.model_validate(data)
    except ValidationError as exc:
        errors = [
            {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False)
        ]
        raise InvalidInput(definition.id, errors) from None


def _unstorable_in(document: object) -> tuple[list[str | int], str] | None:
    """`text.first_unstorable`, walked only when the C JSON encoder's text of `document` is not
    plainly storable (a NUL's escape, a lone surrogate, a type it does not know)."""
    try:
        text = json.dumps(document, ensure_ascii=False)
        if "\\u0000" not in text:
            text.encode()  # a lone surrogate has no UTF-8 encoding: UnicodeEncodeError
            return None
    except (TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        pass
    return first_unstorable(document)


def _trigger_document(
    trigger: TriggerKind | Mapping[str, Any],
) -> tuple[TriggerKind, dict[str, Any]]:
    document = {"kind": trigger.value} if isinstance(trigger, TriggerKind) else dict(trigger)
    try:
        kind = TriggerKind(document.get("kind"))
    except ValueError:
        known = ", ".join(k.value for k in TriggerKind)
        raise StartRefused(f"trigger kind {document.get('kind')!r} is not one of {known}") from None
    if found := _unstorable_in(document):
        loc, reason = found
        raise StartRefused(f"trigger field {loc}: {reason}")
    return kind, document


def resolve_priority(
    explicit: int | None, definition: TaskDefinition, kind: TriggerKind
) -> Priority:
    if explicit is not None:
        try:
            return Priority(explicit)
        except ValueError:
            raise StartRefused(f"priority {explicit!r} is not one of 1, 2, 3, 5, 7") from None
    return definition.task_priority or PRIORITY_BY_TRIGGER[kind]


@dataclass(frozen=True)
class Prepared:
    """A start's arguments checked and resolved, nothing written yet (`prepare`)."""

    definition: TaskDefinition
    input: dict[str, Any]
    trigger: dict[str, Any]
    idempotency_key: str | None
    identity: str
    handle: RunHandle
    # A delayed start's time (`runs.due` releases it then); None: publish on commit.
    not_before: datetime | None
    tags: tuple[str, ...] = ()  # what else the run was about (`runs.search`)

    def admission(self) -> Admission:
        return Admission(
            self.definition,
            self.handle.run_id,
            self.identity,
            self.handle.priority,
            self.trigger,
            not_before=self.not_before,
        )

    def row(
        self,
        state: RunState = RunState.PENDING,
        error: Mapping[str, str] | None = None,
        finished_at: datetime | None = None,
    ) -> dict[str, Any]:
        """The run's INSERT parameters (`insert_run.sql`)."""
        stages = {name: StageState.WAITING.value for name in self.definition.stage_order}
        return {
            "id": self.handle.run_id,
            "task_id": self.definition.id,
            "state": state.value,
            "stages": json.dumps(stages),
            "trigger": json.dumps(self.trigger),
            "input": json.dumps(self.input),
            "error": None if error is None else json.dumps(error),
            "priority": self.handle.priority,
            "identity": self.identity,
            "processing_version": self.definition.processing_version,
            "not_before": self.not_before if state is RunState.PENDING else None,
            "now": timezone.now(),
            "finished_at": finished_at,
            "tags": list(self.tags),
        }


def prepare(
    task_id: str,
    input: Mapping[str, Any] | None,
    *,
    trigger: TriggerKind | Mapping[str, Any],
    priority: int | None = None,
    idempotency_key: str | None = None,
    not_before: datetime | timedelta | None = None,
    tags: Sequence[str] = (),
) -> Prepared:
    """Check a start's arguments (UnknownTaskError, InvalidInput, StartRefused) and resolve
    what its row holds; writes nothing."""
    definition = registry.get()[task_id]
    model = validate_input(definition, input)
    kind, trigger_doc = _trigger_document(trigger)
    # An empty or blank key means "no key" (dedup only on a key the caller chose):
    # a form or client that sends "" must not make every such start share one key.
    if idempotency_key is not None and not idempotency_key.strip():
        idempotency_key = None
    if idempotency_key is not None:
        if reason := unstorable(idempotency_key):
            raise StartRefused(f"idempotency key {reason}")
        if len(idempotency_key) > MAX_IDEMPOTENCY_KEY:
            raise StartRefused(
                f"idempotency key is {len(idempotency_key)} characters; "
                f"at most {MAX_IDEMPOTENCY_KEY}"
            )
        trigger_doc["idempotencyKey"] = idempotency_key
    # A plain start asks nothing of the delayed starts' module (test_footprint).
    due = due_time(not_before) if not_before is not None else None
    # An operator's retry is not coalesced; the plain start's path stays out of `coalesce`.
    if definition.debounce is not None and kind is not TriggerKind.OPERATOR_RETRY:
        due, trigger_doc[coalesce.MARK] = coalesce.first_due(definition, due), True
    if due is not None:
        trigger_doc["notBefore"] = due.isoformat()
    resolved = int(resolve_priority(priority, definition, kind))
    if tracing.ON:
        # The run's page names its trace, and what publishes it later (a delayed start's
        # release) joins it.
        trigger_doc[tracing.HEADER] = tracing.current_traceparent()
    if definition.concurrency is not None or definition.limits:
        try:
            trigger_doc |= keyed.trigger_fields(definition, model)
        except keyed.KeyFailed as exc:
            raise InvalidInput(task_id, [{"loc": exc.loc, "msg": str(exc)}]) from None
    identity = definition.identity(model)
    run_id = new_run_id()
    handle = RunHandle(run_id, task_id, job_id(task_id, identity, run_id), resolved)
    data = model.model_dump(mode="json")
    tagged = checked_tags(tags) if tags else ()
    return Prepared(definition, data, trigger_doc, idempotency_key, identity, handle, due, tagged)


def start_run(
    task_id: str,
    input: Mapping[str, Any] | None,
    *,
    trigger: TriggerKind | Mapping[str, Any],
    priority: int | None = None,
    idempotency_key: str | None = None,
    not_before: datetime | timedelta | None = None,
    tags: Sequence[str] = (),
) -> RunHandle:
    """Record a run and enqueue it once the surrounding transaction commits; with
    `not_before` (a time, or a delay from now), it waits `pending` until then; `tags`: what
    else it was about, for finding it (`runs.search`)."""
    with tracing.span("lumastra.start", {"lumastra.task": task_id}) if tracing.ON else tracing.OFF:
        start = prepare(
            task_id,
            input,
            trigger=trigger,
            priority=priority,
            idempotency_key=idempotency_key,
            not_before=not_before,
            tags=tags,
        )
        handle, identity, key = start.handle, start.identity, start.idempotency_key
        if tracing.ON:
            tracing.annotate(
                {
                    "lumastra.run_id": handle.run_id,
                    "lumastra.class": start.definition.resource_class,
                }
            )
        if key is not None and (duplicate := coalesce.live_run_with_key(task_id, key)):
            # Answered before admission, so a duplicate consumes no quota and counts nothing.
            return answered(joined(task_id, duplicate))
        if (
            start.definition.while_active is not WhileActive.JOIN or coalesce.MARK in start.trigger
        ) and (found := coalesce.join(start)):
            return answered(coalesced(task_id, found))

        admission = start.admission()

        def insert(
            state: RunState = RunState.PENDING,
            error: Mapping[str, str] | None = None,
            finished_at: datetime | None = None,
        ) -> coalesce.Joined | None:
            if coalesce.MARK in start.trigger and state is RunState.PENDING:
                return coalesce.insert_or_join(start)
            with connection.cursor() as cursor:
                durable.send(cursor, queries.INSERT_RUN, start.row(state, error, finished_at))
            return None

        with _transaction(start.definition, key):
            try:
                # No savepoint: a refused, dropped or deduplicated start has the hooks give back
                # what they took (`abandoned`).
                with tracing.span("lumastra.admission") if tracing.ON else tracing.OFF:
                    admit(admission)
            except Deduplicated as dup:
                if found := coalesce.follow(start, dup.run_id):
                    return answered(coalesced(task_id, found))
                return answered(deduplicated(task_id, dup, identity, handle.priority))
            except Dropped as drop:
                # Recorded, never enqueued: the row is born terminal, no transition involved.
                error = {"kind": ErrorKind.DROPPED.value, "message": drop.reason}
                insert(RunState.CANCELLED, error, timezone.now())
                return answered(dataclasses.replace(handle, dropped=True))
            try:
                with tracing.span("lumastra.insert") if tracing.ON else tracing.OFF:
                    taken = _insert_unless_taken(insert, start.definition, key)
            except Exception:
                hooks.abandon(admission)
                raise
            if isinstance(taken, coalesce.Joined):
                hooks.abandon(admission)  # joined a waiting run: it was admitted when recorded
                return answered(coalesced(task_id, taken))
            if taken is not None:
                hooks.abandon(admission)
                transaction.set_rollback(True)  # give back what admission took
            else:
                after_insert(admission)
                # A delayed start's run is counted now; any other's with its live hash
                # (`live.seed`). Published on commit, maybe after this span ended: in its trace.
                publish_it: Callable[[], None] = partial(_publish, start, admission.notes)
                if tracing.ON:
                    publish_it = tracing.within("lumastra.publish", publish_it)
                delayed = start.not_before is not None
                transaction.on_commit(partial(answered, handle) if delayed else publish_it)
                return handle
        return answered(joined(task_id, taken))


def _transaction(definition: TaskDefinition, key: str | None) -> AbstractContextManager[object]:
    """The start's transaction: the caller's; else its own when an idempotency key may roll it
    back, or when admission writes Postgres (a capped quota's unit); else none: the INSERT
    commits by itself, one round trip. Without one, the hooks give back what admission took
    before a failed INSERT (`abandoned`), and their `committed` waits for it."""
    if key is None and not connection.in_atomic_block and not definition.quotas.capped:
        return contextlib.nullcontext()
    return transaction.atomic()


def after_insert(admission: Admission) -> None:
    """The admitted start is inserted: once it commits, cancel the waiting runs its admission
    shed to make room, and do what its hooks asked (`Admission.committed`)."""
    for shed in admission.shed:
        transaction.on_commit(
            partial(shed_runs.cancel_waiting, shed.run_ids, ErrorKind.SHED, shed.reason)
        )
    for action in admission.committed:
        transaction.on_commit(action)


def run_and_wait(
    task_id: str,
    input: Mapping[str, Any] | None,
    *,
    timeout: float,
    trigger: TriggerKind | Mapping[str, Any] = TriggerKind.MANUAL,
    priority: int | None = None,
    idempotency_key: str | None = None,
) -> Any:
    """`start_run` and `wait` in one: the run's result, or RunFailed / TimeoutError. Not inside
    a transaction: the run is published when it commits, so a caller's open one would wait
    for a run that cannot start."""
    if connection.in_atomic_block:
        raise StartRefused("run_and_wait inside a transaction would wait for a run not yet sent")
    handle = start_run(
        task_id, input, trigger=trigger, priority=priority, idempotency_key=idempotency_key
    )
    return handle.wait(timeout)


def _insert_unless_taken(
    insert: Callable[[], coalesce.Joined | None], definition: TaskDefinition, key: str | None
) -> LiveRun | coalesce.Joined | None:
    """Insert the run, or return the live run that holds its idempotency key, or the waiting
    run a debounced start joined instead (`coalesce.insert_or_join`)."""
    if key is None:
        return insert()
    for _ in range(_KEY_RACE_ATTEMPTS):
        try:
            # Only an idempotency key can collide (the live-key unique index); the savepoint
            # that lets this transaction go on after the collision is paid only then.
            with transaction.atomic(savepoint=True):
                return insert()
        except IntegrityError:
            # A concurrent start with the same key won the unique index...
            duplicate = coalesce.live_run_with_key(definition.id, key)
            if duplicate is not None:
                return duplicate
            # ...and its run has already ended, which frees the key: try again.
    raise KeyContended(
        f"idempotency key {key!r}: runs with it kept starting and ending while this start "
        "tried to record its own; try again"
    )


def joined(task_id: str, live_run: LiveRun) -> RunHandle:
    """The handle of the live run that holds this start's idempotency key, as read."""
    job = job_id(task_id, live_run.identity, live_run.id)
    return RunHandle(live_run.id, task_id, job, live_run.priority, deduplicated=True)


def coalesced(task_id: str, found: coalesce.Joined) -> RunHandle:
    """The handle of the waiting run a start joined: a debounced run, or a follow-up."""
    run, followed = (found.run_id, task_id, found.job_id, found.priority), found.followed
    return RunHandle(*run, debounced=not followed, coalesced=followed)


def deduplicated(task_id: str, dup: Deduplicated, identity: str, fallback: int) -> RunHandle:
    # The holder's row may not be visible yet (its insert not committed): then the handle is
    # built from what this start computed, which names the same work.
    run_id = dup.run_id
    priority = TaskHistory.objects.filter(id=run_id).values_list("priority", flat=True).first()
    next_at = dup.next_at if isinstance(dup, Throttled) else None
    job = job_id(task_id, identity, run_id)
    return RunHandle(run_id, task_id, job, priority or fallback, True, next_start_at=next_at)


def _publish(start: Prepared, notes: Mapping[str, bool]) -> None:
    definition, handle = start.definition, start.handle
    sheet = carried(definition, start.input, start.identity, handle.priority)
    turn = start.trigger.get(keyed.KEY_FIELD)
    try:
        if turn is None:
            live.seed(
                handle.run_id, definition.id, handle.priority, definition.stage_order, started=True
            )
            publish(
                definition, handle.run_id, handle.job_id, handle.priority, notes=notes, sheet=sheet
            )
        else:
            _take_turn(start, turn)
    except Exception:
        # The run is committed and pending; the reconciler re-publishes runs whose message
        # is missing. The caller still gets its run id.
        log.exception("run %s recorded but not published", handle.run_id)


def _take_turn(start: Prepared, key: str) -> None:
    """A keyed-concurrency run seeded and registered under its key in one round trip, and
    published if its turn came (`hooks.keyed`)."""
    definition, handle = start.definition, start.handle
    seed = live.Seed(handle.run_id, definition.id, handle.priority, definition.stage_order)
    version = definition.processing_version
    run = keyed.Registered(handle.run_id, key, handle.priority, handle.job_id, version)
    publish_turns(definition, keyed.enqueue(definition, [run], seed=seed))
