"""The stage-sweep: keeps every covered stage's rows moving, once a minute, on the cluster leader.

Each tick, for each stage the registry declares (`coverage.stages`):

1. **Version**: if the covering task's `processing_version` moved on since the last tick, the
   rows it completed under an older one become `obsolete` (and are done again).
2. **Self-heal**: items with no row yet, after the stage's watermark, get one, at most
   LUMASTRA_COVERAGE_SEED_PER_TICK per stage (new items normally get theirs at once from the
   outbox dispatcher; this catches any it missed).
3. **Heal**: the next LUMASTRA_COVERAGE_HEAL_PER_TICK rows skipped as `ineligible` (or for a
   reason the stage lists in `recover_when_additional_reasons`) whose eligibility holds again
   become `pending` — no event needed. The walk resumes where it stopped, so every skipped
   row is looked at again within ceil(skipped / batch) ticks.
4. **Dispose and start** (stages the sweep drives: `enqueueable` and listed in
   LUMASTRA_COVERAGE_AUTHORITATIVE_STAGES): the oldest due rows (`pending`, `obsolete`,
   `failed_transient` and `skipped_transient` whose `next_eligible_at` has come), at most
   LUMASTRA_COVERAGE_STARTS_PER_STAGE, are locked; those whose eligibility no longer holds
   become `skipped_permanent` (`ineligible`), the others get their runs in one batch per
   stage through `orchestrator.runs.batch.start_runs` (one INSERT, one publish; idempotency
   key `coverage:<stage>:<item>`; the run's insert marks the row `running`, migration 0004).
   A stage covered one batch at a time (`per_item=False`) gets one run per tick for its
   batch. A season's row waits until no episode was added or removed for
   LUMASTRA_COVERAGE_SEASON_SETTLE_S. A stage whose class has more than
   LUMASTRA_COVERAGE_CLASS_DEPTH_THRESHOLD messages waiting is skipped for the tick, as are
   the rest of a stage's candidates once admission refuses one (a quota, an open circuit).
   At most LUMASTRA_COVERAGE_STARTS_PER_TICK runs start per tick, all stages together.
5. **Wedged rows**: rows `running` for LUMASTRA_COVERAGE_WEDGED_AFTER_S whose run is no
   longer live become `failed_transient` with a fresh backoff (also at boot, the loop's first
   tick).
6. **Counts**: the backlog's count deltas appended since the last tick are folded into its
   base counts (`coverage.counts`), so reading them stays cheap.

Each stage's candidates are locked and disposed of in one short transaction; their runs then
start one by one, each committed (and published) on its own, with no row lock held, so a
rescan racing the sweep meets the same idempotency key and joins the one run. An item whose
start is refused for its input becomes `failed_permanent` with the refusal; an admission
refusal (quota, circuit, full queue) stops the stage for the tick. One stage failing (its
condition raising on some item) is logged and counted, and the others go on. Each tick logs
what it did and keeps it on the stage's `coverage_stage.last_tick`.

Not guaranteed: the order of starts across stages within a tick (stages take turns in
registry order); a stage whose condition is slow to evaluate slows every tick.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from coverage import counts as stage_counts
from coverage import queries
from coverage.models import CoverageStage, CoverageStatus, MediaItem, MediaItemStageState
from coverage.stages import Covered, covered, sync
from orchestrator.clock import Clock, SystemClock
from orchestrator.routing import class_queues
from orchestrator.runs.batch import INPUT_CODES, Outcome, Result, start_runs
from orchestrator.runs.batches import StartRequest
from orchestrator.stores import broker
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.coverage import ItemFacts
from tasks.definition import Priority

log = logging.getLogger("coverage.sweep")

TRIGGER = {"kind": TriggerKind.SYSTEM.value, "source": "stage-sweep"}


def run_key(stage_id: str, item_id: int | None = None) -> str:
    """The idempotency key of a coverage run (migration 0004 reads the same shape)."""
    return f"coverage:{stage_id}" if item_id is None else f"coverage:{stage_id}:{item_id}"


def _items_of(params: dict[str, Any]) -> list[int]:
    return [params["item_id"]] if "item_id" in params else list(params["item_ids"])


@dataclass
class TickReport:
    """What one tick did, per stage (Counters keyed by stage id)."""

    obsoleted: Counter[str] = field(default_factory=Counter)
    seeded: Counter[str] = field(default_factory=Counter)
    healed: Counter[str] = field(default_factory=Counter)
    disposed: Counter[str] = field(default_factory=Counter)
    started: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    wedged: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    skipped_classes: set[str] = field(default_factory=set)

    def of(self, stage_id: str) -> dict[str, int]:
        counts = (
            "obsoleted",
            "seeded",
            "healed",
            "disposed",
            "started",
            "refused",
            "wedged",
            "errors",
        )
        return {name: getattr(self, name)[stage_id] for name in counts}

    def summary(self) -> str:
        totals = {
            name: sum(getattr(self, name).values())
            for name in (
                "obsoleted",
                "seeded",
                "disposed",
                "healed",
                "started",
                "refused",
                "wedged",
                "errors",
            )
        }
        parts = [f"{name} {count}" for name, count in totals.items()]
        skipped = ", ".join(sorted(self.skipped_classes)) or "none"
        return f"{'; '.join(parts)}; classes skipped: {skipped}"


class Sweep:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()

    def tick(self, *, boot: bool = False) -> TickReport:
        config = settings.COVERAGE
        report = TickReport()
        stages = covered()
        rows = sync(stages)
        budget = config.starts_per_tick
        depth_of: dict[str, int] = {}
        for stage in stages:
            row = rows[stage.id]
            try:
                self._version(stage, row, report)
                self._seed(stage, row, report)
                self._heal(stage, row, report)
                if stage.driven and budget > 0:
                    klass = stage.task.resource_class
                    if klass not in depth_of:
                        depth_of[klass] = self._class_depth(klass)
                    if depth_of[klass] > config.class_depth_threshold:
                        report.skipped_classes.add(klass)
                    else:
                        budget -= self._start(stage, min(budget, config.starts_per_stage), report)
            except Exception:
                # One stage failing (its condition dividing by zero on some item, a store
                # out of reach mid-start) must not stop the others: logged, counted, and
                # tried again next tick.
                log.exception("stage-sweep: stage %s failed this tick", stage.id)
                report.errors[stage.id] += 1
        self.reclaim_wedged(report)
        # The backlog's counts: this tick's changes, and the runs' since the last, into the base.
        try:
            stage_counts.fold()
        except Exception:
            log.exception("stage-sweep: folding the backlog counts failed this tick")
        at = self.clock.now().isoformat()
        for stage in stages:
            skipped = stage.task.resource_class in report.skipped_classes
            CoverageStage.objects.filter(id=stage.id).update(
                last_tick={"at": at, "boot": boot, "class_skipped": skipped, **report.of(stage.id)}
            )
        log.info("stage-sweep%s: %s", " (boot)" if boot else "", report.summary())
        return report

    def _version(self, stage: Covered, row: CoverageStage, report: TickReport) -> None:
        version = stage.task.processing_version
        if row.processing_version == version:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                queries.render("obsolete"),
                {"stage": stage.id, "version": version, "now": self.clock.now()},
            )
            report.obsoleted[stage.id] += cursor.rowcount
        row.processing_version = version
        CoverageStage.objects.filter(id=stage.id).update(processing_version=version)

    def _seed(self, stage: Covered, row: CoverageStage, report: TickReport) -> None:
        limit = settings.COVERAGE.seed_per_tick
        if limit == 0:
            return
        highest, made = seed(stage, self.clock, after=row.seeded_through, limit=limit)
        report.seeded[stage.id] += made
        if highest is not None:
            row.seeded_through = highest
            CoverageStage.objects.filter(id=stage.id).update(seeded_through=highest)

    def _heal(self, stage: Covered, row: CoverageStage, report: TickReport) -> None:
        limit = settings.COVERAGE.heal_per_tick
        if limit == 0:
            return
        next_cursor, healed = heal_batch(stage, self.clock, after=row.heal_cursor, limit=limit)
        report.healed[stage.id] += healed
        row.heal_cursor = next_cursor
        CoverageStage.objects.filter(id=stage.id).update(heal_cursor=next_cursor)

    def _class_depth(self, resource_class: str) -> int:
        queues = class_queues(
            registry.get().values(), resource_class, settings.CONFIG.per_task_queues
        )
        return broker.depth(queues)

    def _start(self, stage: Covered, limit: int, report: TickReport) -> int:
        """Dispose of the stage's ineligible candidates (one short transaction, the rows
        locked), then start runs for the rest, each in its own; returns the runs started."""
        if limit <= 0:
            return 0
        now = self.clock.now()
        settle = timedelta(seconds=settings.COVERAGE.season_settle_s)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                queries.render("candidates", stage.stage),
                {"stage": stage.id, "now": now, "settled_before": now - settle, "limit": limit},
            )
            found = cursor.fetchall()
            ineligible = [row_id for row_id, _, eligible in found if not eligible]
            if ineligible:
                cursor.execute(queries.render("dispose"), {"ids": ineligible, "now": now})
                report.disposed[stage.id] += len(ineligible)
        # No row lock is held while runs start: a rescan racing the sweep for an item meets
        # the same idempotency key and joins the one run, and neither waits on the other.
        items = [item_id for _, item_id, eligible in found if eligible]
        started = self._start_runs(stage, items, report)
        report.started[stage.id] += started
        return started

    def _start_runs(self, stage: Covered, items: list[int], report: TickReport) -> int:
        """One batch of starts (`start_runs`) for the stage's items, or one run for a stage
        covered a batch at a time; returns the runs started."""
        if not items:
            return 0
        if stage.stage.per_item:
            starts = [({"stage": stage.id, "item_id": i}, run_key(stage.id, i)) for i in items]
        else:
            starts = [({"stage": stage.id, "item_ids": items}, run_key(stage.id))]
        requests = [
            StartRequest(
                stage.task.id,
                params,
                trigger=TRIGGER,
                priority=Priority.BACKGROUND,
                idempotency_key=key,
            )
            for params, key in starts
        ]
        # Stopped at admission's first refusal (a quota, an open circuit) or drop: the next
        # candidates would meet it too. A rescan's live run with the key is joined, not new.
        outcomes = start_runs(requests, stop_at_refusal=True)
        for (params, _), outcome in zip(starts, outcomes, strict=True):
            if outcome.result is Result.DROPPED:
                report.refused[stage.id] += 1
            elif outcome.result is Result.REFUSED:
                report.refused[stage.id] += 1
                self._refused(stage, params, outcome)
        return sum(outcome.result is Result.STARTED for outcome in outcomes)

    def _refused(self, stage: Covered, params: dict[str, Any], outcome: Outcome) -> None:
        if outcome.code not in INPUT_CODES:
            log.info(
                "stage-sweep: stage %s: start refused (%s); next tick", stage.id, outcome.detail
            )
            return
        # This item's start can never succeed as it is (its input refused): its row says
        # why, and the stage's other items go on.
        log.warning("stage-sweep: stage %s: %s refused: %s", stage.id, params, outcome.detail)
        MediaItemStageState.objects.filter(stage=stage.id, item_id__in=_items_of(params)).exclude(
            status=CoverageStatus.RUNNING
        ).update(
            status=CoverageStatus.FAILED_PERMANENT,
            last_error=f"start refused: {outcome.detail}"[:2000],
            updated_at=self.clock.now(),
        )

    def reclaim_wedged(self, report: TickReport) -> None:
        now = self.clock.now()
        before = now - timedelta(seconds=settings.COVERAGE.wedged_after_s)
        with connection.cursor() as cursor:
            cursor.execute(queries.render("wedged"), {"before": before, "now": now})
            for (stage_id,) in cursor.fetchall():
                report.wedged[stage_id] += 1
        if report.wedged:
            log.warning("stage-sweep: reclaimed wedged rows: %s", dict(report.wedged))


def heal_batch(stage: Covered, clock: Clock, *, after: int, limit: int) -> tuple[int, int]:
    """The next `limit` rows of the stage's heal walk after row `after`: those skipped as
    `ineligible` (or for a reason the stage lists) whose condition holds again become
    `pending`. Returns where the walk goes on (0: it reached the end and starts over) and how
    many were healed. A stage judged by a predicate over immutable fields never heals."""
    if stage.stage.eligible is not None:
        return 0, 0
    with connection.cursor() as cursor:
        cursor.execute(
            queries.render("heal", stage.stage),
            {
                "stage": stage.id,
                "after": after,
                "reasons": ["ineligible", *stage.stage.recover_when_additional_reasons],
                "limit": limit,
                "now": clock.now(),
            },
        )
        highest, looked, healed = cursor.fetchone()
    return (highest if highest is not None and looked == limit else 0), int(healed)


def seed(
    stage: Covered,
    clock: Clock,
    *,
    after: int = 0,
    items: list[int] | None = None,
    limit: int | None = None,
) -> tuple[int | None, int]:
    """Rows for items of the stage's kinds that have none: those after `after` (at most
    `limit`), or those in `items`. Returns the highest item id looked at and the rows made."""
    params: dict[str, Any] = {
        "stage": stage.id,
        "kinds": list(stage.stage.applies_to),
        "after": after,
        "items": items,
        "limit": limit,
        "now": clock.now(),
    }
    if stage.stage.eligible is not None:
        return _seed_by_predicate(stage, params)
    with connection.cursor() as cursor:
        cursor.execute(queries.render("seed", stage.stage), params)
        highest, made = cursor.fetchone()
    return highest, made


def seed_all(clock: Clock | None = None, batch: int = 20_000) -> dict[str, int]:
    """Rows for every item that has none, in every covered stage, in batches (a bulk load, a
    new stage over an existing catalog); returns the rows made per stage."""
    clock = clock or SystemClock()
    stages = covered()
    marks = sync(stages)
    made: dict[str, int] = {}
    for stage in stages:
        made[stage.id] = 0
        after = 0
        while True:
            highest, count = seed(stage, clock, after=after, limit=batch)
            made[stage.id] += count
            if highest is None:
                break
            after = highest
        mark = max(after, marks[stage.id].seeded_through)
        CoverageStage.objects.filter(id=stage.id).update(seeded_through=mark)
    return made


def _seed_by_predicate(stage: Covered, params: dict[str, Any]) -> tuple[int | None, int]:
    """Seeding for a stage whose eligibility is a Python predicate over immutable fields:
    asked here, once per item; the rows are made with the answer."""
    predicate = stage.stage.eligible
    assert predicate is not None
    found = MediaItem.objects.filter(id__gt=params["after"], kind__in=params["kinds"])
    if params["items"] is not None:
        found = found.filter(id__in=params["items"])
    listed = found.order_by("id").values_list("id", "kind", "library")
    facts = [ItemFacts(*row) for row in (listed[: params["limit"]] if params["limit"] else listed)]
    have = set(
        MediaItemStageState.objects.filter(
            stage=stage.id, item_id__in=[fact.id for fact in facts]
        ).values_list("item_id", flat=True)
    )
    rows = []
    for fact in facts:
        if fact.id in have:
            continue
        eligible = predicate(fact)
        rows.append(
            MediaItemStageState(
                item_id=fact.id,
                stage=stage.id,
                status=CoverageStatus.PENDING if eligible else CoverageStatus.SKIPPED_PERMANENT,
                reason="" if eligible else "ineligible",
                next_eligible_at=params["now"],
            )
        )
    MediaItemStageState.objects.bulk_create(rows, ignore_conflicts=True)
    return (facts[-1].id if facts else None), len(rows)
