"""`start_runs`: many starts in one call, each judged on its own.

Each start is checked and admitted as `start_run` would (`start.prepare`, then the admission
hooks, a Valkey round trip per run), then every admitted run is recorded by one INSERT
(`insert_runs.sql`) in one transaction, and on its commit the live hashes are seeded and the
messages published, a round trip each for the whole batch. What one start would have answered,
each gets in its `Outcome`: started, joined (a live run with its idempotency key, or its
identity, already does the work), debounced (a debounced task's start joined the waiting run
of its identity, `runs.coalesce`), coalesced (the follow-up of its identity's running run,
recorded or given its input), dropped (recorded, cancelled by backpressure), or refused
with its reason and code; a later start with the key of an earlier one in the same batch joins
it, and a later debounced start of an earlier one's identity gives it its input.

With `atomic=True` the batch is all or nothing: the first refusal gives back what admission took
for the starts before it, nothing is written, and every other start is answered `not_started`.
With `stop_at_refusal=True` (the coverage sweep) the starts after an admission refusal or a drop
are not tried (`not_started`): a quota, an open circuit or a full queue would refuse them too.

Not guaranteed: the starts are admitted in order, so a quota that admits three of five admits
the first three. Like `start_run`, the batch joins the caller's transaction: nothing is
published unless it commits.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Admission, Deduplicated, Dropped, Refused
from orchestrator.hooks.keyed import KEY_FIELD
from orchestrator.runs import coalesce
from orchestrator.runs.admission import admit
from orchestrator.runs.batches import Batch, Group, StartRequest, insert_batch
from orchestrator.runs.coalesce import live_run_with_key
from orchestrator.runs.handle import InvalidInput, RunHandle, StartRefused
from orchestrator.runs.publish import Outgoing, carried, seed_and_publish_many
from orchestrator.runs.start import Prepared, after_insert, deduplicated, joined, prepare
from orchestrator.states import RunState
from orchestrator.stores import counters, queries
from tasks.errors import ErrorKind
from tasks.registry import UnknownTaskError

log = logging.getLogger(__name__)

# The most starts one call takes (`POST /runs:batch` says so too).
MAX_BATCH = 1000


class Result(StrEnum):
    STARTED = "started"  # a new run, recorded (published on commit, or when due)
    JOINED = "joined"  # a live run already does this work: its id is answered
    DEBOUNCED = "debounced"  # joined the waiting run of its identity, its input now this one's
    COALESCED = "coalesced"  # the follow-up of its identity's running run: recorded or joined
    THROTTLED = "throttled"  # the identity already made its run this period: that run's id
    DROPPED = "dropped"  # recorded cancelled: the task's queue was full (backpressure `drop`)
    REFUSED = "refused"  # nothing written for this start: `code` and `detail` say why
    NOT_STARTED = "not_started"  # not tried, or given back: another start stopped the batch


@dataclass
class Outcome:
    result: Result
    run_id: str | None = None
    priority: int | None = None
    code: str | None = None  # a refusal's stable code (admission's, or invalid_input, ...)
    detail: str | None = None
    http_status: int | None = None  # what `POST /runs` would have answered for this refusal
    errors: list[dict[str, Any]] = field(default_factory=list)  # invalid input, per field
    next_start_at: datetime | None = None  # throttled: when the identity may make its next run


@dataclass
class _Admitted:
    index: int
    start: Prepared
    admission: Admission
    dropped: str | None = None  # backpressure's reason, when the run is recorded cancelled


def start_runs(
    requests: Sequence[StartRequest],
    *,
    atomic: bool = False,
    stop_at_refusal: bool = False,
    batch: Batch | None = None,
) -> list[Outcome]:
    """Start many runs: one outcome per request, in order (see the module's docstring). With
    `batch`, the runs it records are one batch (`batch.id`, `runs.children`), whose callbacks
    start once every one of them has ended; a run a start joined is not the batch's."""
    if len(requests) > MAX_BATCH:
        raise StartRefused(f"{len(requests)} starts in one batch; at most {MAX_BATCH}")
    if batch is not None:
        batch.check()
    with transaction.atomic():
        starts = admit_all(requests, atomic=atomic, stop_at_refusal=stop_at_refusal)
        if starts.refused_all:
            transaction.set_rollback(True)
            return starts.answered()
        if not starts.record(batch.group() if batch else None):
            transaction.set_rollback(True)
    return starts.answered()


@dataclass
class Starts:
    """Starts admitted and not yet written (`admit_all`): `record` writes them in the caller's
    transaction, `abandon` gives back what admission took."""

    requests: Sequence[StartRequest]
    outcomes: list[Outcome | None]
    admitted: list[_Admitted]
    atomic: bool
    refused_all: bool = False  # an atomic batch refused: nothing will be written
    given_back: bool = False

    def answered(self) -> list[Outcome]:
        return _answered(self.outcomes)

    def abandon(self) -> None:
        """Give back what admission took, once (a step's end may ask again after a failed
        write gave it back already)."""
        if not self.given_back:
            self.given_back = True
            _abandon(self.admitted)

    def record(self, group: Group | None = None) -> bool:
        """One INSERT for the admitted runs (and their batch's row), in the caller's
        transaction; published and counted once it commits. False: an atomic batch lost an
        idempotency key to a concurrent start, and nothing of it may be kept (the caller rolls
        back; admission gave back what it took)."""
        admitted, outcomes = self.admitted, self.outcomes
        try:
            inserted = _insert(admitted, group)
        except Exception:
            self.given_back = True  # by `_insert`
            raise
        # A concurrent start took a key between its read and this insert.
        raced = [e for e in admitted if e.start.handle.run_id not in inserted]
        if raced and self.atomic:
            for entry in raced:
                outcomes[entry.index] = _key_taken(entry.start)
            _give_back(admitted, outcomes)
            return False
        if group is not None:
            kept = [e for e in admitted if e.start.handle.run_id in inserted]
            try:
                insert_batch(group, len(kept), sum(1 for e in kept if e.dropped is not None))
            except Exception:
                self.abandon()
                raise
        for entry in raced:
            hooks.abandon(entry.admission)
            lost = entry.start.handle.run_id
            answer = _joined_after_race(entry.start)
            # Later starts of the batch that joined it join what it was answered instead.
            for index, joined_it in enumerate(outcomes):
                if joined_it is not None and joined_it.run_id == lost:
                    outcomes[index] = answer
        published = [e for e in admitted if e.start.handle.run_id in inserted and not e.dropped]
        for entry in published:
            after_insert(entry.admission)
        transaction.on_commit(lambda: _publish([e for e in published if not e.start.not_before]))
        transaction.on_commit(partial(_count, self.requests, outcomes))
        return True


def admit_all(
    requests: Sequence[StartRequest],
    *,
    atomic: bool = False,
    stop_at_refusal: bool = False,
    priority: int | None = None,
) -> Starts:
    """Each start checked and admitted, nothing written (`Starts.record` writes them). An atomic
    batch with a refusal gives back what admission took (`refused_all`); so does a store that
    failed mid-batch, before its error goes up. `priority`: the default of requests naming none."""
    outcomes: list[Outcome | None] = [None] * len(requests)
    admitted: list[_Admitted] = []
    keyed: dict[tuple[str, str], Prepared] = {}
    try:
        for index, request in enumerate(requests):
            if priority is not None and request.priority is None:
                request = dataclasses.replace(request, priority=priority)
            outcome = outcomes[index] = _admit(request, index, keyed, admitted)
            if _stops(outcome, atomic, stop_at_refusal):
                if atomic and outcome.result is Result.REFUSED:
                    _give_back(admitted, outcomes)
                    return Starts(requests, outcomes, [], atomic, refused_all=True)
                break
    except BaseException:
        _abandon(admitted)  # a store failed mid-batch: nothing of it will be written
        raise
    return Starts(requests, outcomes, admitted, atomic)


# A batch's outcomes as /metrics counts them (`lumastra_start_outcomes_total`).
_COUNTED = {
    Result.STARTED: "started",
    Result.JOINED: "deduplicated",
    Result.DEBOUNCED: "debounced",
    Result.COALESCED: "coalesced",
    Result.THROTTLED: "throttled",
    Result.DROPPED: "dropped",
}


def _count(requests: Sequence[StartRequest], outcomes: Sequence[Outcome | None]) -> None:
    """The batch's outcomes counted for /metrics, in one round trip, once it committed."""
    counted: Counter[tuple[str, ...]] = Counter(
        (request.task_id, _COUNTED[outcome.result])
        for request, outcome in zip(requests, outcomes, strict=True)
        if outcome is not None and outcome.result in _COUNTED
    )
    try:
        counters.add_many(counters.START_OUTCOMES, dict(counted))
    except Exception:
        log.exception("a batch's start outcomes were not counted for /metrics")


def _admit(
    request: StartRequest,
    index: int,
    keyed: dict[tuple[str, str], Prepared],
    admitted: list[_Admitted],
) -> Outcome:
    try:
        start = prepare(
            request.task_id,
            request.input,
            trigger=request.trigger,
            priority=request.priority,
            idempotency_key=request.idempotency_key,
            not_before=request.not_before,
            tags=request.tags,
        )
    except UnknownTaskError as exc:
        return Outcome(Result.REFUSED, code="unknown_task", detail=str(exc), http_status=404)
    except InvalidInput as exc:
        return Outcome(
            Result.REFUSED,
            code="invalid_input",
            detail=f"input is invalid for task {exc.task_id!r}",
            http_status=422,
            errors=exc.errors,
        )
    except StartRefused as exc:
        return Outcome(Result.REFUSED, code="invalid", detail=str(exc), http_status=422)
    task_id, key = request.task_id, start.idempotency_key
    if key is not None:
        earlier = keyed.get((task_id, key))
        if earlier is not None:
            return Outcome(Result.JOINED, earlier.handle.run_id, earlier.handle.priority)
        duplicate = live_run_with_key(task_id, key)
        if duplicate is not None:
            return _outcome_of(joined(task_id, duplicate))
    if coalesce.MARK in start.trigger and (joined_here := _debounced_in_batch(start, admitted)):
        return joined_here
    if found := coalesce.join(start):
        return _coalesced(start, found)
    admission = start.admission()
    try:
        admit(admission)
    except Deduplicated as dup:
        if found := coalesce.follow(start, dup.run_id):
            return _coalesced(start, found)
        handle = deduplicated(task_id, dup, start.identity, start.handle.priority)
        if (next_at := handle.next_start_at) is not None:
            return Outcome(Result.THROTTLED, handle.run_id, handle.priority, next_start_at=next_at)
        return _outcome_of(handle)
    except Dropped as drop:
        admitted.append(_Admitted(index, start, admission, dropped=drop.reason))
        return Outcome(Result.DROPPED, start.handle.run_id, start.handle.priority)
    except Refused as exc:
        return Outcome(Result.REFUSED, code=exc.code, detail=str(exc), http_status=exc.http_status)
    admitted.append(_Admitted(index, start, admission))
    if key is not None:
        # Only a start that will be recorded: a later one with its key joins this run.
        keyed[(task_id, key)] = start
    return Outcome(Result.STARTED, start.handle.run_id, start.handle.priority)


def _stops(outcome: Outcome, atomic: bool, stop_at_refusal: bool) -> bool:
    """Whether this outcome ends the batch: any refusal, when atomic; admission's refusal or a
    drop, when asked to stop there (a refused input says nothing about the next start)."""
    if outcome.result is Result.DROPPED:
        return stop_at_refusal  # the queue is full: the next start would be dropped too
    if outcome.result is not Result.REFUSED:
        return False
    return atomic or (stop_at_refusal and outcome.code not in INPUT_CODES)


# Refusals of the start's own arguments (its task, its input), not of admission.
INPUT_CODES = frozenset({"unknown_task", "invalid_input", "invalid"})


def _insert(admitted: Sequence[_Admitted], group: Group | None = None) -> set[str]:
    """One INSERT for every admitted run (each naming `group`'s batch and parent, if any); the
    ids it recorded."""
    if not admitted:
        return set()
    rows = []
    now = timezone.now()
    for entry in admitted:
        if entry.dropped is None:
            rows.append(entry.start.row())
        else:
            error = {"kind": ErrorKind.DROPPED.value, "message": entry.dropped}
            rows.append(entry.start.row(RunState.CANCELLED, error, now))
    columns = {
        "ids": "id",
        "task_ids": "task_id",
        "states": "state",
        "stages": "stages",
        "triggers": "trigger",
        "inputs": "input",
        "errors": "error",
        "priorities": "priority",
        "identities": "identity",
        "processing_versions": "processing_version",
        "not_befores": "not_before",
        "finished_ats": "finished_at",
    }
    params: dict[str, Any] = {name: [row[c] for row in rows] for name, c in columns.items()}
    params["now"] = now
    params["tags"] = [json.dumps(row["tags"]) for row in rows]
    params["batch_ids"] = [group.batch_id if group else None] * len(rows)
    params["parent_run_ids"] = [group.parent_run_id if group else None] * len(rows)
    try:
        # In a savepoint, so a failed INSERT leaves the transaction usable for the give-backs
        # (a quota's is an UPDATE) before the error goes up.
        with transaction.atomic(savepoint=True), connection.cursor() as cursor:
            cursor.execute(queries.INSERT_RUNS, params)
            return {run_id for (run_id,) in cursor.fetchall()}
    except Exception:
        _abandon(admitted)
        raise


def _debounced_in_batch(start: Prepared, admitted: list[_Admitted]) -> Outcome | None:
    """A debounced start whose identity an earlier start of this batch will record: that
    start's run takes this input (the last wins)."""
    for entry in admitted:
        earlier = entry.start
        if (earlier.definition.id, earlier.identity) == (start.definition.id, start.identity):
            entry.start = dataclasses.replace(earlier, input=start.input)
            return Outcome(Result.DEBOUNCED, earlier.handle.run_id, earlier.handle.priority)
    return None


def _joined_after_race(start: Prepared) -> Outcome:
    duplicate = live_run_with_key(start.definition.id, start.idempotency_key)
    if duplicate is not None:
        return _outcome_of(joined(start.definition.id, duplicate))
    if found := coalesce.join(start):
        return _coalesced(start, found)
    return _key_taken(start)


def _coalesced(start: Prepared, found: coalesce.Joined) -> Outcome:
    result = Result.COALESCED if found.followed else Result.DEBOUNCED
    return Outcome(result, found.run_id, found.priority)


def _key_taken(start: Prepared) -> Outcome:
    return Outcome(
        Result.REFUSED,
        code="key_contended",
        detail=f"idempotency key {start.idempotency_key!r} was taken by another start "
        "meanwhile; try again",
        http_status=409,
    )


def _give_back(admitted: Sequence[_Admitted], outcomes: list[Outcome | None]) -> None:
    """An atomic batch that will not be written: admission gives back what it took, and
    every start not refused is answered `not_started`."""
    _abandon(admitted)
    for index, outcome in enumerate(outcomes):
        if outcome is None or outcome.result is not Result.REFUSED:
            outcomes[index] = Outcome(Result.NOT_STARTED)


def _abandon(admitted: Sequence[_Admitted]) -> None:
    """Admission gives back what it took for starts that will not be written; a dropped start
    was given back when the queue cap dropped it."""
    for entry in reversed(admitted):
        if entry.dropped is None:
            hooks.abandon(entry.admission)


def _answered(outcomes: Sequence[Outcome | None]) -> list[Outcome]:
    return [outcome or Outcome(Result.NOT_STARTED) for outcome in outcomes]


def _outcome_of(handle: RunHandle) -> Outcome:
    return Outcome(Result.JOINED, handle.run_id, handle.priority)


def _publish(entries: Sequence[_Admitted]) -> None:
    try:
        seed_and_publish_many(
            [
                Outgoing(
                    e.start.definition,
                    e.start.handle.run_id,
                    e.start.handle.job_id,
                    e.start.handle.priority,
                    e.admission.notes,
                    sheet=carried(
                        e.start.definition, e.start.input, e.start.identity, e.start.handle.priority
                    ),
                    concurrency_key=e.start.trigger.get(KEY_FIELD),
                )
                for e in entries
            ]
        )
    except Exception:
        # Committed and pending: the reconciler publishes runs whose message is missing.
        log.exception("%d runs recorded but not published", len(entries))
