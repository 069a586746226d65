"""Every (from, to) pair of run and stage states, in Valkey and in Postgres.

Valkey: for each pair a run is put in `from` by legal moves only, then moved to `to` with the
Lua primitives (`live.transition`, `live.claim`, `live.transition_stage`). A legal pair
succeeds; any other raises IllegalTransition and leaves both stores exactly as they were.

Postgres: every writer of run state (`stores.durable`, one named statement per move: claim,
end, put back, cancel request, cancel end, orphan end, pending-deadline end, and the stage
moves) is called on a run in each state, and on a run Postgres does not have. Each makes
exactly its moves (the `WRITERS` table, each move in `RUN_LEGAL` or `STAGE_LEGAL`), closes a
pipeline's stages when the move ends the run, and refuses every other source with
IllegalTransition, changing nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from orchestrator.models import TaskHistory
from orchestrator.runs.start import new_run_id
from orchestrator.states import (
    RUN_SOURCES,
    RUN_TRANSITIONS,
    STAGE_SOURCES,
    STAGE_TRANSITIONS,
    TERMINAL_RUN_STATES,
    IllegalTransition,
    RunState,
    StageState,
)
from orchestrator.stores import durable, keys, live, valkey
from orchestrator.stores.live import FencedWrite

pytestmark = pytest.mark.django_db

R = RunState
S = StageState

# The legal moves, written out rather than read from states.py, so the test checks the table.
RUN_LEGAL = {
    (R.PENDING, R.ACTIVE),
    (R.ACTIVE, R.COMPLETED),
    (R.ACTIVE, R.FAILED),
    (R.ACTIVE, R.CANCELLING),
    (R.CANCELLING, R.CANCELLED),
    (R.PENDING, R.CANCELLING),
    # Our additions (docs/architecture.md): a run refused before it started still ends;
    # a transient failure goes back in line for its next attempt.
    (R.PENDING, R.FAILED),
    (R.ACTIVE, R.PENDING),
    # ... and a claim Postgres lost (its commit does not wait for a flush) ends by its own end.
    (R.PENDING, R.COMPLETED),
}
STAGE_LEGAL = {
    (S.WAITING, S.ACTIVE),
    (S.ACTIVE, S.COMPLETED),
    (S.ACTIVE, S.FAILED),
    (S.WAITING, S.SKIPPED),
    (S.ACTIVE, S.WAITING),  # our addition: a stage waits for its next attempt (issue 10)
}

# Legal moves that bring a fresh (pending / waiting) run or stage into each state.
RUN_PATH: dict[RunState, list[RunState]] = {
    R.PENDING: [],
    R.ACTIVE: [R.ACTIVE],
    R.CANCELLING: [R.CANCELLING],
    R.COMPLETED: [R.ACTIVE, R.COMPLETED],
    R.FAILED: [R.ACTIVE, R.FAILED],
    R.CANCELLED: [R.CANCELLING, R.CANCELLED],
}
STAGE_PATH: dict[StageState, list[StageState]] = {
    S.WAITING: [],
    S.ACTIVE: [S.ACTIVE],
    S.COMPLETED: [S.ACTIVE, S.COMPLETED],
    S.FAILED: [S.ACTIVE, S.FAILED],
    S.SKIPPED: [S.SKIPPED],
}

OWNER = "worker-a:1"
STAGES = ("extract", "encode")
STAGE = "extract"


def _pair_id(pair: tuple[Any, Any]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


RUN_PAIRS = list(product(RunState, RunState))
STAGE_PAIRS = list(product(StageState, StageState))


def _run_in(state: RunState) -> str:
    """A run in `state` in both stores, reached by legal moves; its stages all `waiting`."""
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id,
        task_id="test-noop",
        priority=5,
        identity="transitions",
        trigger={"kind": "manual"},
        stages={name: S.WAITING.value for name in STAGES},
    )
    assert live.seed(run_id, "test-noop", 5, STAGES)
    for step in RUN_PATH[state]:
        _move(run_id, step)
        _durable_step(run_id, step)
    assert live.read(run_id)["state"] == state
    assert TaskHistory.objects.get(id=run_id).state == state
    return run_id


def _move(run_id: str, target: RunState, owner: str = "") -> RunState:
    """The live move to `target` by the script that makes it: the claim, an end, or a
    transition (the others); the state it left."""
    if target is R.ACTIVE:
        previous = RunState(live.read(run_id).get("state") or R.PENDING)
        live.claim(run_id, owner or OWNER, live.NO_PAUSE)
        return previous
    if target in TERMINAL_RUN_STATES:
        return live.end(run_id, target, live.EndCount("test-noop"), owner=owner).previous
    return live.transition(run_id, target, owner=owner)


def _durable_step(run_id: str, step: RunState) -> None:
    """The writer's move that takes a run along RUN_PATH, as OWNER's claim."""
    if step is R.ACTIVE:
        assert durable.claim(run_id, OWNER) is not None
    elif step is R.CANCELLING:
        durable.request_cancel(run_id)
    elif step is R.CANCELLED:
        durable.end_cancelled(run_id, finished_at=timezone.now())
    else:
        durable.end(run_id, step, finished_at=timezone.now(), owner=OWNER)


def _stage_in(state: StageState) -> str:
    """An active run whose stage `extract` is in `state` in both stores."""
    run_id = _run_in(R.ACTIVE)
    for step in STAGE_PATH[state]:
        live.transition_stage(run_id, STAGE, step)
        durable.move_stage(run_id, STAGE, step)
    assert live.read(run_id)[f"stage:{STAGE}"] == state
    assert TaskHistory.objects.get(id=run_id).stages[STAGE] == state
    return run_id


def _stores(run_id: str) -> dict[str, Any]:
    """Everything either store holds about the run."""
    client = valkey.client()
    row = TaskHistory.objects.values().get(id=run_id)
    return {
        "active": client.hgetall(keys.run_active(run_id)),
        "terminal": client.hgetall(keys.run_terminal(run_id)),
        "row": row,
    }


def _assert_key_location(run_id: str, state: RunState) -> None:
    client = valkey.client()
    active, terminal = keys.run_active(run_id), keys.run_terminal(run_id)
    if state in TERMINAL_RUN_STATES:
        assert not client.exists(active)
        assert 0 < client.ttl(terminal) <= settings.CONFIG.run_terminal_ttl_s
    else:
        assert not client.exists(terminal)
        assert 0 < client.ttl(active) <= settings.CONFIG.run_active_ttl_s


# --- the tables themselves --------------------------------------------------------------------


def test_states_py_allows_exactly_the_design_transitions() -> None:
    run_edges = {(a, b) for a, nxt in RUN_TRANSITIONS.items() for b in nxt}
    stage_edges = {(a, b) for a, nxt in STAGE_TRANSITIONS.items() for b in nxt}

    assert run_edges == RUN_LEGAL
    assert stage_edges == STAGE_LEGAL
    for target in RunState:
        assert RUN_SOURCES[target] == sorted(a.value for a, b in RUN_LEGAL if b is target)
    for stage_target in StageState:
        assert STAGE_SOURCES[stage_target] == sorted(
            a.value for a, b in STAGE_LEGAL if b is stage_target
        )


# --- runs: every (from, to) pair --------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), RUN_PAIRS, ids=map(_pair_id, RUN_PAIRS))
def test_run_transition(source: RunState, target: RunState) -> None:
    run_id = _run_in(source)
    before = _stores(run_id)

    if (source, target) in RUN_LEGAL:
        assert _move(run_id, target) is source

        assert live.read(run_id)["state"] == target
        _assert_key_location(run_id, target)
        return

    with pytest.raises(IllegalTransition) as in_valkey:
        _move(run_id, target)

    assert in_valkey.value.store == "valkey"
    assert (in_valkey.value.run_id, in_valkey.value.current, in_valkey.value.target) == (
        run_id,
        source,
        target,
    )
    assert _stores(run_id) == before
    _assert_key_location(run_id, source)


@pytest.mark.parametrize("source", [s for s in RunState if s not in TERMINAL_RUN_STATES])
def test_claim_from_each_live_state(source: RunState) -> None:
    """`claim_run.lua` is the worker's way to pending → active; it agrees with the table."""
    run_id = _run_in(source)
    before = _stores(run_id)

    if (source, R.ACTIVE) in RUN_LEGAL:
        live.claim(run_id, "worker-b:7", live.NO_PAUSE)
        snapshot = live.read(run_id)
        assert (snapshot["state"], snapshot["owner"]) == ("active", "worker-b:7")
        assert snapshot["started_at"]
        return

    with pytest.raises(IllegalTransition) as caught:
        live.claim(run_id, "worker-b:7", live.NO_PAUSE)
    assert (caught.value.current, caught.value.target, caught.value.store) == (
        source,
        R.ACTIVE,
        "valkey",
    )
    assert _stores(run_id) == before


@pytest.mark.parametrize("source", sorted(TERMINAL_RUN_STATES))
def test_claim_of_an_ended_run_is_refused_and_writes_nothing(source: RunState) -> None:
    run_id = _run_in(source)
    before = _stores(run_id)

    with pytest.raises(IllegalTransition):
        live.claim(run_id, "worker-b:7", live.NO_PAUSE)

    assert _stores(run_id) == before
    _assert_key_location(run_id, source)


@pytest.mark.parametrize("source", sorted(TERMINAL_RUN_STATES))
def test_claim_of_an_ended_run_reports_its_state(source: RunState) -> None:
    run_id = _run_in(source)

    with pytest.raises(IllegalTransition) as caught:
        live.claim(run_id, "worker-b:7", live.NO_PAUSE)

    assert caught.value.current == source


def test_a_run_neither_store_has_cannot_move() -> None:
    run_id = new_run_id()

    with pytest.raises(IllegalTransition) as in_valkey:
        live.transition(run_id, R.CANCELLING)
    with pytest.raises(IllegalTransition) as claimed:
        live.claim(run_id, OWNER, live.NO_PAUSE)

    assert in_valkey.value.current is claimed.value.current is None
    assert live.read(run_id) == {}


# --- Postgres: every writer of run state, from every state ---------------------------------


@dataclass(frozen=True)
class Writer:
    """One move of `stores.durable`, called as its caller calls it on a run `_run_in` made
    (claimed by OWNER at attempt 1 once active), and the edges it makes: source → target."""

    name: str
    call: Callable[[str], object]
    moves: dict[RunState, RunState]
    # A lost claim's end: from pending it replays the claim (pending → active) first.
    replays_claim: bool = False


# A staleness threshold every heartbeat passes, even one stamped in this test's own transaction
# (`now()` is the transaction's start); the condition itself: tests/integration/test_reconciler.py.
ANY_BEAT = -1.0


def _error(kind: str) -> dict[str, str]:
    return {"kind": kind, "message": "transition table"}


def _end(target: RunState, owner: str, attempt: int | None = None) -> Callable[[str], object]:
    return lambda run_id: durable.end(
        run_id, target, finished_at=timezone.now(), owner=owner, attempt=attempt
    )


def _claim(run_id: str) -> object:
    if durable.claim(run_id, "worker-b:7") is None:
        raise IllegalTransition(run_id, durable.state_of(run_id), R.ACTIVE, "postgres")
    return None


def _put_back(stale_after_s: float | None) -> Callable[[str], object]:
    return lambda run_id: durable.put_back(
        run_id,
        owner=OWNER,
        attempts=1,
        error=_error("worker_lost"),
        not_before=timezone.now(),
        stale_after_s=stale_after_s,
    )


def _orphan(judged: RunState) -> Callable[[str], object]:
    return lambda run_id: durable.end_orphan(
        run_id, judged, error=_error("orphaned"), stale_after_s=ANY_BEAT
    )


WRITERS = [
    Writer("claim", _claim, {R.PENDING: R.ACTIVE}),
    # The claim's own end, naming the attempt its claim returned (`runs.terminal.end`);
    # also what the drain replays.
    Writer(
        "end completed",
        _end(R.COMPLETED, OWNER, attempt=1),
        {R.ACTIVE: R.COMPLETED, R.PENDING: R.COMPLETED},
        replays_claim=True,
    ),
    Writer(
        "end failed",
        _end(R.FAILED, OWNER, attempt=1),
        {R.ACTIVE: R.FAILED, R.PENDING: R.FAILED},
        replays_claim=True,
    ),
    Writer("end, naming no attempt", _end(R.COMPLETED, OWNER), {R.ACTIVE: R.COMPLETED}),
    # A writer holding no claim: a run refused before it started, a redelivery's give-up.
    Writer("end unclaimed", _end(R.FAILED, ""), {R.PENDING: R.FAILED, R.ACTIVE: R.FAILED}),
    Writer("put back (retry)", _put_back(None), {R.ACTIVE: R.PENDING}),
    Writer("put back (reconciler)", _put_back(ANY_BEAT), {R.ACTIVE: R.PENDING}),
    Writer(
        "cancel request",
        durable.request_cancel,
        {R.PENDING: R.CANCELLING, R.ACTIVE: R.CANCELLING},
    ),
    Writer(
        "cancel request (not started)",
        lambda run_id: durable.request_cancel(run_id, sources=(R.PENDING,)),
        {R.PENDING: R.CANCELLING},
    ),
    Writer(
        "cancel end",
        lambda run_id: durable.end_cancelled(run_id, finished_at=timezone.now()),
        {R.CANCELLING: R.CANCELLED},
    ),
    Writer("orphan end (active)", _orphan(R.ACTIVE), {R.ACTIVE: R.FAILED}),
    Writer("orphan end (cancelling)", _orphan(R.CANCELLING), {R.CANCELLING: R.CANCELLED}),
    Writer(
        "pending-deadline end",
        lambda run_id: durable.fail_pending(
            run_id, error=_error("orphaned"), older_than_s=ANY_BEAT
        ),
        {R.PENDING: R.FAILED},
    ),
]
WRITER_CASES = [(w, s) for w in WRITERS for s in [*RunState, None]]


def _case_id(case: tuple[Writer, RunState | None]) -> str:
    writer, source = case
    return f"{writer.name}:{source.value if source else 'missing'}"


def test_every_writer_makes_legal_moves_only_and_every_legal_move_has_a_writer() -> None:
    made: set[tuple[RunState, RunState]] = set()
    for writer in WRITERS:
        for source, target in writer.moves.items():
            assert (source, target) in RUN_LEGAL, writer.name
            made.add((source, target))

    assert made == RUN_LEGAL


def _row(run_id: str) -> dict[str, Any]:
    return TaskHistory.objects.values().get(id=run_id)


@pytest.mark.parametrize(("writer", "source"), WRITER_CASES, ids=map(_case_id, WRITER_CASES))
def test_each_writer_from_each_state(writer: Writer, source: RunState | None) -> None:
    run_id = new_run_id() if source is None else _run_in(source)
    before = None if source is None else _row(run_id)

    if source in writer.moves:
        writer.call(run_id)

        row = _row(run_id)
        target = writer.moves[source]
        assert row["state"] == target
        waiting = {name: S.WAITING.value for name in STAGES}
        if target in TERMINAL_RUN_STATES:
            # The move that ends a run ends its stages: none started, so all skipped.
            assert row["stages"] == {name: S.SKIPPED.value for name in STAGES}
            assert row["finished_at"] is not None
        else:
            assert row["stages"] == waiting
        if writer.replays_claim and source is R.PENDING:
            assert (row["owner_instance_id"], row["attempts"]) == (OWNER, 1)
        return

    with pytest.raises(IllegalTransition) as caught:
        writer.call(run_id)

    assert (caught.value.run_id, caught.value.current, caught.value.store) == (
        run_id,
        source,
        "postgres",
    )
    if source is None:
        assert not TaskHistory.objects.filter(id=run_id).exists()
    else:
        assert _row(run_id) == before


# --- stages: every (from, to) pair ------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), STAGE_PAIRS, ids=map(_pair_id, STAGE_PAIRS))
def test_stage_transition(source: StageState, target: StageState) -> None:
    run_id = _stage_in(source)
    before = _stores(run_id)

    if (source, target) in STAGE_LEGAL:
        assert live.transition_stage(run_id, STAGE, target) is source
        durable.move_stage(run_id, STAGE, target)

        snapshot = live.read(run_id)
        row = TaskHistory.objects.get(id=run_id)
        assert snapshot[f"stage:{STAGE}"] == target
        assert row.stages[STAGE] == target
        # Only the one stage moved; the run did not.
        assert snapshot["stage:encode"] == row.stages["encode"] == "waiting"
        assert snapshot["state"] == row.state == "active"
        return

    with pytest.raises(IllegalTransition) as in_valkey:
        live.transition_stage(run_id, STAGE, target)
    with pytest.raises(IllegalTransition) as in_postgres:
        durable.move_stage(run_id, STAGE, target)

    for caught, store in ((in_valkey, "valkey"), (in_postgres, "postgres")):
        assert caught.value.store == store
        assert (caught.value.run_id, caught.value.current, caught.value.target) == (
            run_id,
            source,
            f"{STAGE}:{target.value}",
        )
    assert _stores(run_id) == before


def test_an_unknown_stage_cannot_move() -> None:
    run_id = _run_in(R.ACTIVE)
    before = _stores(run_id)

    with pytest.raises(IllegalTransition) as in_valkey:
        live.transition_stage(run_id, "nope", S.ACTIVE)
    with pytest.raises(IllegalTransition) as in_postgres:
        durable.move_stage(run_id, "nope", S.ACTIVE)

    assert in_valkey.value.current is None and in_postgres.value.current is None
    assert _stores(run_id) == before


@pytest.mark.parametrize("ended", sorted(TERMINAL_RUN_STATES))
def test_stages_of_an_ended_run_cannot_move(ended: RunState) -> None:
    run_id = _run_in(ended)
    before = _stores(run_id)

    with pytest.raises(IllegalTransition) as in_valkey:
        live.transition_stage(run_id, STAGE, S.ACTIVE)
    with pytest.raises(IllegalTransition) as in_postgres:
        durable.move_stage(run_id, STAGE, S.ACTIVE)

    assert in_valkey.value.current is None and in_postgres.value.current is None
    assert _stores(run_id) == before


def test_a_stage_move_made_before_the_runs_end_is_followed_in_its_terminal_snapshot() -> None:
    """One worker skips a stage in Postgres; another ends the run (every stage now ended) and
    settles it before the first follows in Valkey: the snapshot still comes to say skipped, as
    Postgres does (found by the resume test of test_pipelines, a race between two workers)."""
    run_id = _run_in(R.COMPLETED)
    terminal = keys.run_terminal(run_id)
    assert valkey.client().hget(terminal, f"stage:{STAGE}") == S.WAITING

    assert live.transition_stage(run_id, STAGE, S.SKIPPED) is S.WAITING

    assert valkey.client().hget(terminal, f"stage:{STAGE}") == S.SKIPPED
    assert not valkey.client().exists(keys.run_active(run_id))


@pytest.mark.parametrize("source", list(StageState))
def test_a_stage_claim_takes_only_a_waiting_stage(source: StageState) -> None:
    """`claim_stage.sql`, a stage worker's way to waiting → active, agrees with the table."""
    run_id = _stage_in(source)
    before = _row(run_id)

    claimed = durable.claim_stage(run_id, STAGE, "cpu", "worker-b:7")

    if (source, S.ACTIVE) in STAGE_LEGAL:
        assert claimed is not None and claimed.owner == OWNER
        assert _row(run_id)["stages"][STAGE] == S.ACTIVE
    else:
        assert claimed is None
        assert _row(run_id) == before


@pytest.mark.parametrize("source", list(RunState))
def test_stages_are_claimed_only_while_the_run_is_active(source: RunState) -> None:
    run_id = _run_in(source)
    before = _row(run_id)

    claimed = durable.claim_stage(run_id, STAGE, "cpu", "worker-b:7")

    assert (claimed is not None) == (source is R.ACTIVE)
    if claimed is None:
        assert _row(run_id) == before


@pytest.mark.parametrize("source", list(RunState))
def test_completed_stages_are_reused_only_by_a_pending_run(source: RunState) -> None:
    run_id = _run_in(source)
    before = _row(run_id)
    reused = {STAGE: S.COMPLETED.value}

    if source is R.PENDING:
        durable.reuse_stages(run_id, reused, {STAGE: {"n": 1}}, {STAGE: {"reused_from": "x"}})
        assert _row(run_id)["stages"] == {STAGE: "completed", "encode": "waiting"}
        return
    with pytest.raises(IllegalTransition) as caught:
        durable.reuse_stages(run_id, reused, {}, {})
    assert caught.value.current == source
    assert _row(run_id) == before


def test_a_stage_name_is_data_not_sql() -> None:
    name = "it's; DROP TABLE task_history --"
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id, task_id="test-noop", priority=5, identity="x", stages={name: "waiting"}
    )

    durable.move_stage(run_id, name, S.ACTIVE)

    assert TaskHistory.objects.get(id=run_id).stages == {name: "active"}


# --- the terminal key and the owner fence -----------------------------------------------------


def test_a_terminal_move_renames_the_hash_to_the_terminal_key() -> None:
    run_id = _run_in(R.ACTIVE)
    client = valkey.client()
    assert client.exists(keys.run_active(run_id))

    _move(run_id, R.COMPLETED, owner=OWNER)

    assert not client.exists(keys.run_active(run_id))
    ended = client.hgetall(keys.run_terminal(run_id))
    assert ended["state"] == "completed"
    assert (ended["run_id"], ended["task_id"], ended["owner"]) == (run_id, "test-noop", OWNER)
    assert ended["finished_at"] and ended["stage:extract"] == "waiting"
    assert 0 < client.ttl(keys.run_terminal(run_id)) <= settings.CONFIG.run_terminal_ttl_s
    assert live.read(run_id) == ended


def test_a_non_terminal_move_keeps_the_active_key_and_refreshes_its_ttl() -> None:
    run_id = _run_in(R.PENDING)
    client = valkey.client()
    client.expire(keys.run_active(run_id), 5)

    live.transition(run_id, R.CANCELLING)

    assert client.ttl(keys.run_active(run_id)) > 5
    assert not client.exists(keys.run_terminal(run_id))


def test_a_write_from_another_owner_is_fenced() -> None:
    run_id = _run_in(R.ACTIVE)
    before = _stores(run_id)

    with pytest.raises(FencedWrite, match=OWNER):
        _move(run_id, R.COMPLETED, owner="worker-b:7")
    with pytest.raises(FencedWrite, match=OWNER):
        _move(run_id, R.PENDING, owner="worker-b:7")

    assert _stores(run_id) == before
    assert live.read(run_id)["owner"] == OWNER


def test_the_owner_may_write_and_an_operator_skips_the_fence() -> None:
    mine, operators = _run_in(R.ACTIVE), _run_in(R.ACTIVE)

    assert _move(mine, R.FAILED, owner=OWNER) is R.ACTIVE
    assert live.transition(operators, R.CANCELLING) is R.ACTIVE  # owner="" : no fence

    assert live.read(mine)["state"] == "failed"
    assert live.read(operators)["state"] == "cancelling"


def test_an_illegal_move_is_refused_before_the_fence() -> None:
    run_id = _run_in(R.COMPLETED)

    with pytest.raises(IllegalTransition):
        _move(run_id, R.FAILED, owner="worker-b:7")


# --- a claim Postgres lost, and a claim put back -------------------------------------------


def _end_as(run_id: str, owner: str, attempt: int) -> None:
    durable.end(run_id, R.COMPLETED, finished_at=timezone.now(), owner=owner, attempt=attempt)


def test_a_put_back_claims_late_end_is_not_taken_for_a_lost_claim() -> None:
    """The row keeps the put-back claim's attempt count, so its end naming that attempt does
    not match the lost-claim case (one below the claim's)."""
    run_id = _run_in(R.ACTIVE)
    _put_back(None)(run_id)
    before = _row(run_id)

    with pytest.raises(IllegalTransition) as caught:
        _end_as(run_id, OWNER, attempt=1)

    assert caught.value.current == R.PENDING
    assert _row(run_id) == before


def test_the_lost_claim_of_a_later_attempt_ends_and_the_earlier_claim_cannot() -> None:
    run_id = _run_in(R.ACTIVE)
    _put_back(None)(run_id)  # attempt 1 retried; attempt 2's claim by worker-b:7 then lost
    with pytest.raises(IllegalTransition):
        _end_as(run_id, OWNER, attempt=1)

    _end_as(run_id, "worker-b:7", attempt=2)

    row = _row(run_id)
    assert (row["state"], row["owner_instance_id"], row["attempts"]) == (
        "completed",
        "worker-b:7",
        2,
    )
    assert row["started_at"] is not None
