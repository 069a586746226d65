"""Run state in Postgres: the one writer of `task_history.state` and of a run's stage states.

Every move of a run or a stage is one named, guarded statement here, one `.sql` file each under
`sql/` (`stores.queries`), each refusing what `states.py` does not allow:

- claim (`claim`, claim_run.sql): pending → active; a short plain run's claim is folded into
  its end instead (`read_claimable`, read_claimable.sql, reads what the run needs without
  writing; `runs.watch` writes the claim if the run is still going after a second);
- end (`end`, end_run.sql; the drain replays this same call): active → completed or failed,
  pending → failed for a run that never started, and a claim's end whose claim a crash of
  Postgres lost: pending → (active →) completed or failed;
- put back (`put_back`, put_back_run.sql): active → pending for the next attempt;
- cancel request (`request_cancel`, request_cancel.sql): pending or active → cancelling;
- cancel end (`end_cancelled`, cancel_run.sql): cancelling → cancelled;
- orphan end (`end_orphan`, end_orphan.sql): active → failed, cancelling → cancelled;
- pending-deadline end (`fail_pending`, fail_pending.sql): pending → failed;
- a stage's claim, move and reuse (`claim_stage`, `move_stage`, `reuse_stages`).

Each move that ends a run ends its pipeline stages in the same statement
(`lumastra_close_stages`, migration 0010). Whether a live run's heartbeat is stale is one SQL
function (`lumastra_heartbeat_stale`, migration 0017) that every query judging it calls.
Nothing else in the engine writes these columns: `tests/unit/test_one_writer.py` scans the tree.

A refused move raises IllegalTransition naming the state that refused it (read only then, a
second statement on the refusal alone); `claim` returns None instead.

`send` sends a named query (`stores.queries`), a `Prepared` one as text for its first
LUMASTRA_DB_PREPARE_THRESHOLD - 1 uses on a connection, then `PREPARE` and `EXECUTE` in one
round trip, then `EXECUTE` alone: Postgres skips parsing and planning it (40 % of the cost of
those every run sends, issue 9). A statement the server forgot (`DISCARD ALL`) goes as text on
that connection from then on. Set the threshold to 0 behind a pooler that shares server
connections between clients (PgBouncer in transaction mode).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models.functions import Now

from orchestrator.models import TaskHistory
from orchestrator.states import (
    LIVE_RUN_STATES,
    RUN_SOURCES,
    STAGE_SOURCES,
    IllegalTransition,
    RunState,
    StageState,
)
from orchestrator.stores import queries


@dataclass(frozen=True)
class ClaimedRun:
    """What the runner needs of a run it has just claimed, as the claim returned it."""

    run_id: str
    input: Any
    identity: str
    priority: int
    attempts: int  # counting the attempt this claim starts
    stages: dict[str, str]  # a pipeline run's stages (a resumed run's reused ones completed)
    results: dict[str, Any]  # their results
    # Read by `read_claimable`: Postgres still says pending until the end (or the watch)
    # writes this claim; when the claim was taken, for that write's `started_at`.
    deferred_since: datetime | None = None


def json_value(value: Any) -> Any:
    # Django's psycopg2 backend leaves jsonb undecoded (JSONField decodes it); a raw cursor
    # sees the text.
    return json.loads(value) if isinstance(value, str) else value


def _json_out(value: Any) -> str | None:
    # None is SQL NULL, as JSONField(null=True) stores it, not the JSON `null`.
    return None if value is None else json.dumps(value)


_UNKNOWN_STATEMENT = "26000"  # invalid_sql_statement_name: the server forgot it
_IN_FAILED_TRANSACTION = "25P02"  # nothing ran, PREPARE included
_NEVER = -1  # on this connection, send as text
_PREPARED = -2
# Per raw connection: uses so far of each query, or one of the two markers above. A new
# connection (Django reconnects after an error or past its age) starts from nothing.
_uses: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def send(
    cursor: Any, query: queries.Prepared | str, params: dict[str, Any], *, before: str = ""
) -> None:
    """Execute a named query on a Django cursor, prepared once its connection uses it often
    (a `Prepared`) or as text (a plain query); `before` is sent first in the same round trip (a
    `SET LOCAL` for the statement's own implicit transaction)."""
    if isinstance(query, str):
        cursor.execute(before + query, params)
        return
    uses = _uses.setdefault(cursor.cursor.connection, {})
    seen = uses.get(query.name, 0)
    threshold = settings.CONFIG.db_prepare_threshold
    if threshold > 0 and seen != _NEVER:
        if seen == _PREPARED or seen + 1 >= threshold:
            statement = query.execute if seen == _PREPARED else f"{query.prepare};\n{query.execute}"
            _send_prepared(cursor, query, statement, params, before, uses)
            return
        uses[query.name] = seen + 1
    cursor.execute(before + query.text, params)


def _send_prepared(
    cursor: Any, query: queries.Prepared, statement: str, params: Any, before: str, uses: Any
) -> None:
    try:
        cursor.execute(before + statement, params)
    except DatabaseError as exc:
        code = getattr(exc.__cause__, "pgcode", None)
        if code == _UNKNOWN_STATEMENT:
            uses[query.name] = _NEVER
            if not cursor.db.in_atomic_block:
                # Nothing ran and no transaction was spoiled: send it again, as text.
                cursor.execute(before + query.text, params)
                return
        elif statement != query.execute and code != _IN_FAILED_TRANSACTION:
            # PREPARE went first and outlives the failure of what followed it.
            uses[query.name] = _PREPARED
        raise
    uses[query.name] = _PREPARED


# The claim's commit does not wait for its WAL flush; why it may not: stores/sql/claim_run.sql.
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off;\n"


def state_of(run_id: str) -> str | None:
    """The run's state in Postgres, or None if it has no row."""
    with connection.cursor() as cursor:
        cursor.execute(queries.RUN_STATE, {"run_id": run_id})
        found = cursor.fetchone()
    return None if found is None else str(found[0])


def claim(
    run_id: str,
    owner: str,
    *,
    started_at: datetime | None = None,
    heard_at: datetime | None = None,
    attempt: int | None = None,
) -> ClaimedRun | None:
    """pending → active for `owner`, if the run is pending and due; None if it is not.
    `started_at`: when a deferred claim (`read_claimable`) was really taken; `heard_at`: when
    its owner was last heard of, for a claim written on its behalf (both default to now);
    `attempt`: the attempt a deferred claim read, written only if no claim came between."""
    params = {
        "run_id": run_id,
        "owner": owner,
        "started_at": started_at,
        "heard_at": heard_at,
        "attempt": attempt,
    }
    with connection.cursor() as cursor:
        send(cursor, queries.CLAIM_RUN, params, before=ASYNC_COMMIT)
        found = cursor.fetchone()
    return None if found is None else _claimed(run_id, found)


def read_claimable(run_id: str, *, since: datetime) -> ClaimedRun | None:
    """What a claim would return, read without writing it, if the run is pending and due;
    None if it is not. The claim itself is written later, by the run's end (`end` with the
    returned attempt count and `started_at=since`) or by its watch (`claim`)."""
    with connection.cursor() as cursor:
        send(cursor, queries.READ_CLAIMABLE, {"run_id": run_id})
        found = cursor.fetchone()
    return None if found is None else _claimed(run_id, found, since)


def _claimed(run_id: str, found: Any, deferred_since: datetime | None = None) -> ClaimedRun:
    input_, identity, priority, attempts, stages, results = found
    return ClaimedRun(
        run_id,
        json_value(input_),
        identity,
        priority,
        attempts,
        json_value(stages),
        json_value(results),
        deferred_since,
    )


def end(
    run_id: str,
    target: RunState,
    *,
    finished_at: datetime,
    result: Any = None,
    error: dict[str, Any] | None = None,
    step: dict[str, Any] | None = None,
    progress: dict[str, Any] | None = None,
    owner: str = "",
    attempt: int | None = None,
    started_at: datetime | None = None,
) -> None:
    """The run ends in `target` (completed or failed) with this result and error, replacing
    what it had, a plain run's step extras (warnings, counters, cost, log tail; `runs.steps`)
    and its latest progress (when it reported any); an illegal move raises IllegalTransition
    with the state that refused it. With `owner`, only while the run is that claim's: a run
    put back to pending after its worker was lost, and claimed again, refuses the old
    claim's late end (the refusal then names the run's live state). With `attempt` too (the
    count that claim returned), a run Postgres still calls pending one attempt below it, its
    claim's commit lost in a crash of Postgres or not written yet (`read_claimable`), ends as
    well, taking the claim with it, started at `started_at` (default: now)."""
    if target not in (RunState.COMPLETED, RunState.FAILED):
        raise ValueError(f"end() writes completed or failed, not {target}")
    sources = RUN_SOURCES[target]
    if target is RunState.COMPLETED:
        # pending → completed is only ever a claim's own end (`claimable` below): no writer
        # completes a run that no claim started.
        sources = [source for source in sources if source != RunState.PENDING]
    params = {
        "run_id": run_id,
        "target": target.value,
        "sources": sources,
        # A lost claim's end replays the claim's own move (end_run.sql).
        "claimable": RUN_SOURCES[RunState.ACTIVE],
        "attempt": attempt,
        "result": _json_out(result),
        "error": _json_out(error),
        "step": _json_out(step),
        "cost": _json_out(step.get("cost") or None) if step else None,
        "progress": _json_out(progress),
        "finished_at": finished_at,
        "started_at": started_at,
        "owner": owner,
    }
    _guarded(queries.END_RUN, params, run_id, target)


def end_cancelled(
    run_id: str, *, finished_at: datetime, error: dict[str, Any] | None = None
) -> None:
    """cancelling → cancelled; the run keeps its error unless one is given."""
    params = {"run_id": run_id, "error": _json_out(error), "finished_at": finished_at}
    _guarded(queries.CANCEL_RUN, params, run_id, RunState.CANCELLED)


def _guarded(
    query: queries.Prepared | str, params: dict[str, Any], run_id: str, target: RunState
) -> None:
    with connection.cursor() as cursor:
        send(cursor, query, params)
        updated = cursor.rowcount
    if updated != 1:
        # Only a refusal pays a second statement, to say what refused it.
        raise IllegalTransition(run_id, state_of(run_id), target, "postgres")


def request_cancel(
    run_id: str, *, sources: Collection[RunState] = (RunState.PENDING, RunState.ACTIVE)
) -> RunState:
    """→ cancelling from one of `sources`; returns the state the run left (a run no handler
    runs yet is ended at once by the caller)."""
    allowed = set(RUN_SOURCES[RunState.CANCELLING])
    if not {s.value for s in sources} <= allowed:
        raise ValueError(f"cancelling is reached only from {sorted(allowed)}, not {sources}")
    with connection.cursor() as cursor:
        cursor.execute(
            queries.REQUEST_CANCEL,
            {"run_id": run_id, "sources": sorted(s.value for s in sources)},
        )
        found = cursor.fetchone()
    if found is None:
        raise IllegalTransition(run_id, state_of(run_id), RunState.CANCELLING, "postgres")
    return RunState(found[0])


def put_back(
    run_id: str,
    *,
    owner: str,
    attempts: int,
    error: dict[str, Any],
    not_before: datetime | None,
    stale_after_s: float | None = None,
    refund: bool = False,
) -> None:
    """active → pending for the next attempt, fenced by the claim that ran this one (`owner`,
    and `attempts` as that claim counted them); with `stale_after_s`, only while the run's
    heartbeat is at least that old. The owner is cleared, `error` says why, `not_before` is
    the backoff; with `refund`, the attempt that claim counted is given back."""
    params = {
        "run_id": run_id,
        "owner": owner,
        "attempts": attempts,
        "error": _json_out(error),
        "not_before": not_before,
        "stale_s": stale_after_s,
        "refund": int(refund),
    }
    _guarded(queries.PUT_BACK_RUN, params, run_id, RunState.PENDING)


def end_orphan(
    run_id: str, source: RunState, *, error: dict[str, Any], stale_after_s: float
) -> RunState:
    """An orphan ends: active → failed, cancelling → cancelled (a cancel request wins), only
    while the run is still in `source` and its heartbeat at least `stale_after_s` old.
    Returns the state it ended in."""
    target = RunState.FAILED if source == RunState.ACTIVE else RunState.CANCELLED
    if source.value not in RUN_SOURCES[target]:
        raise IllegalTransition(run_id, source, target, "postgres")
    params = {
        "run_id": run_id,
        "source": source.value,
        "target": target.value,
        "error": _json_out(error),
        "stale_s": stale_after_s,
    }
    _guarded(queries.END_ORPHAN, params, run_id, target)
    return target


def fail_pending(run_id: str, *, error: dict[str, Any], older_than_s: float) -> None:
    """pending → failed for a run the reconciler gives up on, only while it is still pending
    and has been for at least `older_than_s` (by the Postgres clock)."""
    params = {"run_id": run_id, "error": _json_out(error), "older_than_s": older_than_s}
    _guarded(queries.FAIL_PENDING, params, run_id, RunState.FAILED)


@dataclass(frozen=True)
class ClaimedStage:
    """What a worker needs of a pipeline stage it has just claimed."""

    run_id: str
    stage: str
    input: Any
    owner: str  # the run's claim: the stage's heartbeats and fences are the run's
    identity: str
    priority: int
    results: dict[str, Any]  # of the stages that completed before it
    step: dict[str, Any]  # its step record, this attempt counted (orchestrator/runs/steps.py)


def claim_stage(run_id: str, stage: str, resource_class: str, owner: str) -> ClaimedStage | None:
    """waiting → active for one stage of an active run; None if the stage is not waiting or
    the run is not active."""
    params = {"run_id": run_id, "stage": stage, "resource_class": resource_class, "owner": owner}
    with connection.cursor() as cursor:
        cursor.execute(queries.CLAIM_STAGE, params)
        found = cursor.fetchone()
    if found is None:
        return None
    input_, owner, identity, priority, results, step = found
    return ClaimedStage(
        run_id,
        stage,
        json_value(input_),
        owner,
        identity,
        priority,
        json_value(results),
        json_value(step),
    )


@dataclass(frozen=True)
class Stages:
    """A pipeline run's stages as one move left them."""

    states: dict[str, str]
    results: dict[str, Any]


def move_stage(
    run_id: str,
    stage: str,
    target: StageState,
    *,
    result: Any = None,
    step: dict[str, Any] | None = None,
    cost: dict[str, float] | None = None,
    claimer: str | None = None,
    stale_after_s: float | None = None,
    active_only: bool = False,
) -> Stages:
    """Move one stage of a live run, with its result, its step record's new fields and this
    attempt's cost, if any; an illegal move raises IllegalTransition whose `current` is the
    stage's state, or None when the run is missing or ended or has no such stage. With
    `claimer`, only while that process's claim is the stage's latest (its step record's
    `owner`): a stage retried after its claimer was lost refuses the old claim's late end.
    With `stale_after_s`, only while the run's heartbeat is at least that old. With
    `active_only`, not while the run is being cancelled (a stage end that spawns children)."""
    live_states = sorted(s.value for s in LIVE_RUN_STATES)
    params = {
        "run_id": run_id,
        "stage": stage,
        "target": target.value,
        "sources": STAGE_SOURCES[target],
        "live": [RunState.ACTIVE.value] if active_only else live_states,
        "result": _json_out(result),
        "step": _json_out(step),
        "cost": _json_out(cost or None),
        "claimer": claimer,
        "stale_s": stale_after_s,
    }
    with connection.cursor() as cursor:
        cursor.execute(queries.MOVE_STAGE, params)
        found = cursor.fetchone()
    if found is not None:
        return Stages(json_value(found[0]), json_value(found[1]))
    row = TaskHistory.objects.filter(id=run_id).values_list("state", "stages").first()
    current = None
    if row is not None and row[0] in live_states and isinstance(row[1], dict):
        current = row[1].get(stage)
    raise IllegalTransition(run_id, current, f"{stage}:{target.value}", "postgres")


def reuse_stages(
    run_id: str, stages: dict[str, str], results: dict[str, Any], steps: dict[str, Any]
) -> None:
    """A pending run takes stages another run completed (a resume)."""
    params = {
        "run_id": run_id,
        "stages": json.dumps(stages),
        "results": json.dumps(results),
        "steps": json.dumps(steps),
    }
    with connection.cursor() as cursor:
        cursor.execute(queries.REUSE_STAGES, params)
        if cursor.rowcount != 1:
            raise IllegalTransition(run_id, state_of(run_id), "pending (reuse stages)", "postgres")


def heartbeat(run_id: str, owner: str) -> bool:
    """Stamp `heartbeat_at` with the Postgres clock while `owner` still runs the run."""
    return (
        TaskHistory.objects.filter(
            id=run_id,
            owner_instance_id=owner,
            state__in=[RunState.ACTIVE, RunState.CANCELLING],
        ).update(heartbeat_at=Now())
        == 1
    )
