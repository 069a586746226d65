"""Run state in Postgres: guarded UPDATEs that refuse what DESIGN §4 does not allow."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from orchestrator.models import TaskHistory
from orchestrator.states import (
    LIVE_RUN_STATES,
    IllegalTransition,
    RunState,
    StageState,
    run_sources,
    stage_sources,
)


def transition(
    run_id: str, target: RunState, *, only_from: RunState | None = None, **fields: Any
) -> None:
    """`UPDATE … WHERE id = %s AND state = ANY(sources)`; an illegal move raises.

    `only_from` narrows the sources to one legal state, for callers whose next step depends
    on where the run was (a cancel before pickup ends at once, a running one does not)."""
    sources = run_sources(target)
    if only_from is not None:
        sources = [s for s in sources if s == only_from]
    updated = TaskHistory.objects.filter(id=run_id, state__in=sources).update(
        state=target, updated_at=timezone.now(), **fields
    )
    if updated != 1:
        current = TaskHistory.objects.filter(id=run_id).values_list("state", flat=True).first()
        raise IllegalTransition(run_id, current, target, "postgres")


# One guarded UPDATE: the stage moves only from a legal source state, and only while the run
# is live (an ended run's stages are final, as in Valkey, where its live hash is gone).
_TRANSITION_STAGE = """
UPDATE task_history
   SET stages = jsonb_set(stages, ARRAY[%s], to_jsonb(%s::text)), updated_at = %s
 WHERE id = %s AND state = ANY(%s) AND stages ->> %s = ANY(%s)
"""


def transition_stage(run_id: str, stage: str, target: StageState) -> None:
    """Move one stage of `task_history.stages`; an illegal move raises IllegalTransition.

    `current` on the error is the stage's state, or None when the run is missing or ended or
    has no such stage.
    """
    live_states = sorted(s.value for s in LIVE_RUN_STATES)
    sources = stage_sources(target)
    with connection.cursor() as cursor:
        cursor.execute(
            _TRANSITION_STAGE,
            (stage, target.value, timezone.now(), run_id, live_states, stage, sources),
        )
        updated = cursor.rowcount
    if updated != 1:
        found = TaskHistory.objects.filter(id=run_id).values_list("state", "stages").first()
        current = None
        if found is not None and found[0] in live_states and isinstance(found[1], dict):
            current = found[1].get(stage)
        raise IllegalTransition(run_id, current, f"{stage}:{target.value}", "postgres")


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
