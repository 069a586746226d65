"""The outbox dispatcher: turns catalog changes into rows that need their stages again.

Triggers on the catalog tables write one `event_outbox` row per change and item in the
change's own transaction (`coverage.models`). Every LUMASTRA_COVERAGE_DISPATCH_INTERVAL_S, on
the cluster leader, the dispatcher takes the due events in batches of
LUMASTRA_COVERAGE_DISPATCH_BATCH (`FOR UPDATE SKIP LOCKED`, so two dispatchers never take the
same event) and, in the batch's transaction:

- `item.created`: gives the new items their rows in every stage that applies to their kind
  (`pending`, or `skipped_permanent` when not eligible);
- any other kind: for each stage that lists it in `invalidated_by`, the items' rows that are
  `skipped_*` or `obsolete` and eligible become `pending`; a content-changing kind
  (`tasks.coverage.EVENT_KINDS`) also resets `completed` and `failed_*` rows, and marks a
  `running` row so that its run's end sends it back to `pending` (the run may have read the
  item as it was);
- then deletes the events.

A batch that fails is tried again one event at a time, so one bad event does not hold back
the rest: a failing event is retried with exponential backoff and jitter and, after
LUMASTRA_COVERAGE_DISPATCH_MAX_ATTEMPTS failures, dead-lettered (`dead_at`; the admin's
outbox page redelivers it). Runs are not started here: the stage-sweep starts them.

Not guaranteed: order between events (a reset and a newer reset of the same row give the
same `pending`); an event for an item deleted since is dropped silently.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction

from coverage import queries
from coverage.models import CoverageStatus, EventOutbox
from coverage.stages import Covered, covered, sync
from coverage.sweep import seed
from orchestrator.backoff import jittered_backoff
from orchestrator.clock import Clock, SystemClock
from tasks.coverage import EVENT_KINDS
from tasks.policies import Retry

log = logging.getLogger("coverage.dispatcher")

# Batches one tick takes at most; the rest wait for the next tick.
MAX_BATCHES_PER_TICK = 20
# The backoff between an event's failed dispatches (its base and cap; how many attempts before
# the dead letter is LUMASTRA_COVERAGE_DISPATCH_MAX_ATTEMPTS).
BACKOFF = Retry(max_attempts=1, base=timedelta(seconds=30), cap=timedelta(hours=1))

_RESET_FROM = [
    CoverageStatus.SKIPPED_PERMANENT,
    CoverageStatus.SKIPPED_TRANSIENT,
    CoverageStatus.OBSOLETE,
]
_RESET_FROM_ON_CONTENT = [
    *_RESET_FROM,
    CoverageStatus.COMPLETED,
    CoverageStatus.FAILED_TRANSIENT,
    CoverageStatus.FAILED_PERMANENT,
]


@dataclass
class DispatchReport:
    dispatched: int = 0
    seeded: Counter[str] = field(default_factory=Counter)  # rows made, by stage
    reset: Counter[str] = field(default_factory=Counter)  # rows back to pending, by stage
    failed: int = 0
    dead: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Event:
    id: int
    kind: str
    item_id: int
    attempts: int


class Dispatcher:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()

    def tick(self) -> DispatchReport:
        report = DispatchReport()
        stages = covered()
        sync(stages)
        for _ in range(MAX_BATCHES_PER_TICK):
            if self.dispatch_batch(stages, report) < settings.COVERAGE.dispatch_batch:
                break
        if report.dispatched or report.failed:
            log.info(
                "dispatcher: %d events (%d rows made, %d reset), %d failed, %d dead-lettered",
                report.dispatched,
                sum(report.seeded.values()),
                sum(report.reset.values()),
                report.failed,
                report.dead,
            )
        return report

    def dispatch_batch(self, stages: list[Covered], report: DispatchReport) -> int:
        """One batch in one transaction; returns how many events it took."""
        with transaction.atomic():
            events = self._take()
            if not events:
                return 0
            try:
                with transaction.atomic():
                    self._dispatch(stages, events, report)
            except Exception:
                for event in events:
                    try:
                        with transaction.atomic():
                            self._dispatch(stages, [event], report)
                    # Whatever an event raises (SQL, a stage's predicate) is its own failure,
                    # counted toward its dead letter: it never holds the queue.
                    except Exception as exc:
                        self._failed(event, exc, report)
        return len(events)

    def _take(self) -> list[_Event]:
        found = (
            EventOutbox.objects.select_for_update(skip_locked=True)
            .filter(dead_at__isnull=True, next_attempt_at__lte=self.clock.now())
            .order_by("next_attempt_at", "id")
            .values_list("id", "kind", "item_id", "attempts")[: settings.COVERAGE.dispatch_batch]
        )
        return [_Event(*row) for row in found]

    def _dispatch(
        self, stages: list[Covered], events: list[_Event], report: DispatchReport
    ) -> None:
        """Apply `events` and delete them; counted in `report` only once all of it is done."""
        seeded: Counter[str] = Counter()
        reset: Counter[str] = Counter()
        items_by_kind: dict[str, list[int]] = defaultdict(list)
        for event in events:
            items_by_kind[event.kind].append(event.item_id)
        created = items_by_kind.pop("item.created", [])
        for stage in stages:
            if created:
                seeded[stage.id] += seed(stage, self.clock, items=created)[1]
            for kind, items in items_by_kind.items():
                if kind in stage.stage.invalidated_by:
                    reset[stage.id] += self._reset(stage, kind, items)
        EventOutbox.objects.filter(id__in=[event.id for event in events]).delete()
        report.dispatched += len(events)
        report.seeded.update(seeded)
        report.reset.update(reset)

    def _reset(self, stage: Covered, kind: str, items: list[int]) -> int:
        content = EVENT_KINDS.get(kind, False)
        statuses = _RESET_FROM_ON_CONTENT if content else _RESET_FROM
        with connection.cursor() as cursor:
            if content:
                # A run going now may have read the item as it was: its end sends the row
                # back to pending (migration 0006) instead of calling it done.
                cursor.execute(
                    queries.render("rerun"),
                    {"stage": stage.id, "items": items, "now": self.clock.now()},
                )
            cursor.execute(
                queries.render("reset", stage.stage),
                {
                    "stage": stage.id,
                    "items": items,
                    "statuses": [str(s) for s in statuses],
                    "now": self.clock.now(),
                },
            )
            return int(cursor.rowcount)

    def _failed(self, event: _Event, exc: Exception, report: DispatchReport) -> None:
        attempts = event.attempts + 1
        now = self.clock.now()
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        dead = attempts >= settings.COVERAGE.dispatch_max_attempts
        EventOutbox.objects.filter(id=event.id).update(
            attempts=attempts,
            last_error=message[:2000],
            next_attempt_at=now + jittered_backoff(BACKOFF, attempts),
            dead_at=now if dead else None,
        )
        report.failed += 1
        report.dead += dead
        report.errors.append(message)
        log.warning(
            "dispatcher: event %d (%s, item %d) failed, attempt %d%s: %s",
            event.id,
            event.kind,
            event.item_id,
            attempts,
            " — dead-lettered" if dead else "",
            message,
        )


def redeliver(event_ids: list[int]) -> int:
    """Dead-lettered events back to the queue, due now, attempts from zero."""
    return EventOutbox.objects.filter(id__in=event_ids, dead_at__isnull=False).update(
        dead_at=None, attempts=0, next_attempt_at=SystemClock().now(), last_error=""
    )
