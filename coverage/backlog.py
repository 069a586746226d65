"""What operators ask of coverage: how far each stage has got, which items are where and why,
and "do this item now" (rescan) or "look at the skipped rows again now" (heal). The API
(`coverage.api`) and the admin (`coverage.admin`) both call these; neither writes rows itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from coverage import queries
from coverage.models import CoverageStage, CoverageStatus, MediaItem, MediaItemStageState
from coverage.stages import Covered, covered, find, sync
from coverage.sweep import run_key, seed
from orchestrator.clock import Clock, SystemClock
from orchestrator.runs.start import RunHandle, start_run
from tasks.coverage import ItemFacts
from tasks.definition import Priority


class UnknownStage(LookupError):
    def __init__(self, stage_id: str) -> None:
        super().__init__(f"no covered stage {stage_id!r}")


class UnknownItem(LookupError):
    def __init__(self, item_id: int) -> None:
        super().__init__(f"no item {item_id}")


class NotCovered(ValueError):
    """The item's kind is not one the stage applies to, or the item is not eligible."""


@dataclass(frozen=True)
class StageBacklog:
    stage: str
    task_id: str
    applies_to: tuple[str, ...]
    enqueueable: bool
    driven: bool  # the sweep starts its runs
    counts: dict[str, int]
    oldest_due_at: datetime | None  # the oldest due row's `next_eligible_at`
    last_tick: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def stage_or_404(stage_id: str) -> Covered:
    found = find(stage_id)
    if found is None:
        raise UnknownStage(stage_id)
    return found


def overview() -> list[StageBacklog]:
    """Every covered stage with its counts per status and its oldest due row; two queries."""
    stages = covered()
    counts: dict[str, dict[str, int]] = {
        c.id: dict.fromkeys(CoverageStatus.values, 0) for c in stages
    }
    oldest: dict[str, datetime | None] = {}
    with connection.cursor() as cursor:
        cursor.execute(queries.render("backlog_counts"))
        for stage_id, status, count in cursor.fetchall():
            if stage_id in counts:
                counts[stage_id][status] = count
        cursor.execute(queries.render("backlog_oldest"), {"stages": [c.id for c in stages]})
        oldest = dict(cursor.fetchall())
    ticks = dict(CoverageStage.objects.values_list("id", "last_tick"))
    return [
        StageBacklog(
            stage=c.id,
            task_id=c.task.id,
            applies_to=c.stage.applies_to,
            enqueueable=c.stage.enqueueable,
            driven=c.driven,
            counts=counts[c.id],
            oldest_due_at=oldest.get(c.id),
            last_tick=ticks.get(c.id) or {},
        )
        for c in stages
    ]


def rows(
    stage_id: str, status: str | None, after: int = 0, limit: int = 50
) -> tuple[list[MediaItemStageState], int | None]:
    """A stage's rows (in `status`, if given) by row id after `after`, with their items; and
    where the next page starts (None on the last)."""
    stage_or_404(stage_id)
    found = MediaItemStageState.objects.filter(stage=stage_id, id__gt=after)
    if status is not None:
        found = found.filter(status=status)
    page = list(found.select_related("item").order_by("id")[: limit + 1])
    if len(page) <= limit:
        return page, None
    return page[:limit], page[limit - 1].pk


def rescan(stage_id: str, item_id: int, trigger: dict[str, Any]) -> RunHandle:
    """Process `item_id` for the stage now: its row is made if missing, its eligibility asked
    again, and its run started at once (priority 2) — or the live run that already does it
    is returned. Raises NotCovered when the item is not of the stage's kinds or not eligible
    (its row then says `ineligible`)."""
    stage = stage_or_404(stage_id)
    item = MediaItem.objects.filter(id=item_id).values_list("id", "kind", "library").first()
    if item is None:
        raise UnknownItem(item_id)
    facts = ItemFacts(*item)
    if facts.kind not in stage.stage.applies_to:
        raise NotCovered(
            f"stage {stage_id!r} applies to {', '.join(stage.stage.applies_to)}, "
            f"not to item {item_id} ({facts.kind})"
        )
    sync([stage])
    seed(stage, SystemClock(), items=[item_id])
    if not _eligible(stage, facts):
        MediaItemStageState.objects.filter(stage=stage_id, item_id=item_id).exclude(
            status=CoverageStatus.RUNNING
        ).update(status=CoverageStatus.SKIPPED_PERMANENT, reason="ineligible")
        raise NotCovered(f"item {item_id} is not eligible for stage {stage_id!r}")
    params: dict[str, Any] = (
        {"stage": stage_id, "item_id": item_id}
        if stage.stage.per_item
        else {"stage": stage_id, "item_ids": [item_id]}
    )
    key = run_key(stage_id, item_id if stage.stage.per_item else None)
    return start_run(
        stage.task.id,
        params,
        trigger=trigger,
        priority=Priority.INTERACTIVE,
        idempotency_key=key,
    )


def heal(stage_id: str, clock: Clock | None = None) -> int:
    """The stage's whole heal walk now (the sweep does a batch per tick); returns rows healed."""
    stage = stage_or_404(stage_id)
    if stage.stage.eligible is not None:
        return 0
    now = (clock or SystemClock()).now()
    reasons = ["ineligible", *stage.stage.recover_when_additional_reasons]
    with connection.cursor() as cursor:
        cursor.execute(
            queries.render("heal", stage.stage),
            {"stage": stage_id, "after": 0, "reasons": reasons, "limit": None, "now": now},
        )
        _, _, healed = cursor.fetchone()
    return int(healed)


def _eligible(stage: Covered, facts: ItemFacts) -> bool:
    if stage.stage.eligible is not None:
        return bool(stage.stage.eligible(facts))
    with connection.cursor() as cursor:
        cursor.execute(queries.render("eligible", stage.stage), {"item": facts.id})
        found = cursor.fetchone()
    return bool(found and found[0])
