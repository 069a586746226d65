"""Run state in Postgres: guarded UPDATEs that refuse what DESIGN §4 does not allow."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from orchestrator.models import TaskHistory
from orchestrator.states import IllegalTransition, RunState, run_sources


def transition(run_id: str, target: RunState, **fields: Any) -> None:
    """`UPDATE … WHERE id = %s AND state = ANY(sources)`; an illegal move raises."""
    updated = TaskHistory.objects.filter(id=run_id, state__in=run_sources(target)).update(
        state=target, updated_at=timezone.now(), **fields
    )
    if updated != 1:
        current = TaskHistory.objects.filter(id=run_id).values_list("state", flat=True).first()
        raise IllegalTransition(run_id, current, target, "postgres")
