"""Run and stage states and the transitions between them.

This table is the single Python source of truth; in Valkey the run moves are split by the
script that makes them (`lua/claim_run.lua` pending → active, `lua/end_run.lua` every end,
`lua/transition_run.lua` the rest), `lua/transition_stage.lua` carries the stage table, and a
table-driven test checks every (from, to) pair against both stores.
"""

from __future__ import annotations

from django.db import models


class RunState(models.TextChoices):
    PENDING = "pending"  # recorded and enqueued, not yet claimed by a worker
    ACTIVE = "active"  # claimed; the handler is running
    CANCELLING = "cancelling"  # cancel requested; waiting for the handler or the claim to stop
    COMPLETED = "completed"  # handler returned
    FAILED = "failed"  # handler raised, or the run could not start (see error.kind)
    CANCELLED = "cancelled"  # stopped on request


class StageState(models.TextChoices):
    WAITING = "waiting"  # dependencies not yet done, or waiting for its next attempt
    ACTIVE = "active"  # running
    COMPLETED = "completed"  # done
    FAILED = "failed"  # raised
    SKIPPED = "skipped"  # its `when` said no


RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    # pending → failed is legal: a run refused before it ever started
    # (stale processing_version, input no longer valid) must still end. So is pending →
    # completed, made only by a claim's own end when Postgres never kept that claim (its
    # commit does not wait for its flush, so a crash of Postgres can lose it): the end takes
    # the claim's move with it, one guarded statement (stores/sql/end_run.sql, issue 22).
    RunState.PENDING: frozenset(
        {RunState.ACTIVE, RunState.CANCELLING, RunState.FAILED, RunState.COMPLETED}
    ),
    # active → pending is our addition too: a TransientError puts the run back in line for
    # its next attempt (same run, attempts + 1) rather than ending it.
    RunState.ACTIVE: frozenset(
        {RunState.COMPLETED, RunState.FAILED, RunState.CANCELLING, RunState.PENDING}
    ),
    RunState.CANCELLING: frozenset({RunState.CANCELLED}),
    RunState.COMPLETED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.CANCELLED: frozenset(),
}

STAGE_TRANSITIONS: dict[StageState, frozenset[StageState]] = {
    StageState.WAITING: frozenset({StageState.ACTIVE, StageState.SKIPPED}),
    # active → waiting is legal: a stage that raised TransientError waits
    # for its next attempt (the stage alone is retried, not the run).
    StageState.ACTIVE: frozenset({StageState.COMPLETED, StageState.FAILED, StageState.WAITING}),
    StageState.COMPLETED: frozenset(),
    StageState.FAILED: frozenset(),
    StageState.SKIPPED: frozenset(),
}

TERMINAL_RUN_STATES = frozenset(s for s, nxt in RUN_TRANSITIONS.items() if not nxt)
LIVE_RUN_STATES = frozenset(RunState) - TERMINAL_RUN_STATES


# The states a run (a stage) may move to each target from, for guarded UPDATEs: read on every
# run's end, so computed once here.
RUN_SOURCES: dict[RunState, list[str]] = {
    target: sorted(s.value for s, nxt in RUN_TRANSITIONS.items() if target in nxt)
    for target in RunState
}
STAGE_SOURCES: dict[StageState, list[str]] = {
    target: sorted(s.value for s, nxt in STAGE_TRANSITIONS.items() if target in nxt)
    for target in StageState
}


class IllegalTransition(Exception):
    """A store refused a state change that the transition tables do not allow."""

    def __init__(self, run_id: str, current: str | None, target: str, store: str) -> None:
        shown = current if current is not None else "missing"
        super().__init__(f"run {run_id}: illegal transition {shown} → {target} ({store})")
        self.run_id = run_id
        self.current = current
        self.target = target
        self.store = store
