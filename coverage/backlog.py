"""What operators ask of coverage: how far each stage has got, which items are where and why,
and "do this item now" (rescan) or "look at the skipped rows again now" (heal). The API
(`coverage.api`) and the admin (`coverage.admin`) both call these; neither writes rows itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from coverage import counts as stage_counts
from coverage import queries
from coverage.models import CoverageStage, CoverageStatus, MediaItem, MediaItemStageState
from coverage.stages import Covered, covered, find, sync
from coverage.sweep import heal_batch, run_key, seed
from orchestrator.clock import EPOCH, Clock, SystemClock
from orchestrator.models import TaskHistory
from orchestrator.runs.handle import RunHandle
from orchestrator.runs.start import start_run
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
    oldest_due_at: datetime | None  # the oldest row due now: its `next_eligible_at`
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
    """Every covered stage with its counts per status (kept as rows change, `coverage.counts`)
    and its oldest due row; two queries."""
    stages = covered()
    counts: dict[str, dict[str, int]] = {
        c.id: dict.fromkeys(CoverageStatus.values, 0) for c in stages
    }
    for (stage_id, status), count in stage_counts.read().items():
        if stage_id in counts:
            counts[stage_id][status] = count
    oldest: dict[str, datetime | None] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            queries.render("backlog_oldest"),
            {"stages": [c.id for c in stages], "now": timezone.now()},
        )
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
        ).update(
            status=CoverageStatus.SKIPPED_PERMANENT, reason="ineligible", updated_at=timezone.now()
        )
        raise NotCovered(f"item {item_id} is not eligible for stage {stage_id!r}")
    params: dict[str, Any] = (
        {"stage": stage_id, "item_id": item_id}
        if stage.stage.per_item
        else {"stage": stage_id, "item_ids": [item_id]}
    )
    key = run_key(stage_id, item_id if stage.stage.per_item else None)
    handle = start_run(
        stage.task.id,
        params,
        trigger=trigger,
        priority=Priority.INTERACTIVE,
        idempotency_key=key,
    )
    if handle.deduplicated and not stage.stage.per_item:
        batch = TaskHistory.objects.filter(id=handle.run_id).values_list("input", flat=True)
        if item_id not in (batch.first() or {}).get("item_ids", []):
            # The stage's one batch run is busy with other items: this one goes first in the
            # next batch instead of being reported as done by a run that never sees it.
            MediaItemStageState.objects.filter(stage=stage_id, item_id=item_id).exclude(
                status=CoverageStatus.RUNNING
            ).update(
                status=CoverageStatus.PENDING, next_eligible_at=EPOCH, updated_at=timezone.now()
            )
            raise NotCovered(
                f"stage {stage_id!r} is covered one batch at a time and run {handle.run_id} "
                f"is busy with another batch; item {item_id} goes first in the next one"
            )
    return handle


def heal(stage_id: str, clock: Clock | None = None) -> int:
    """The stage's whole heal walk now (the sweep does a batch per tick), batch by batch;
    returns the rows healed."""
    stage = stage_or_404(stage_id)
    clock = clock or SystemClock()
    batch = max(settings.COVERAGE.heal_per_tick, 1000)
    healed = after = 0
    while True:
        after, count = heal_batch(stage, clock, after=after, limit=batch)
        healed += count
        if after == 0:
            return healed


def _eligible(stage: Covered, facts: ItemFacts) -> bool:
    if stage.stage.eligible is not None:
        return bool(stage.stage.eligible(facts))
    with connection.cursor() as cursor:
        cursor.execute(queries.render("eligible", stage.stage), {"item": facts.id})
        found = cursor.fetchone()
    return bool(found and found[0])
