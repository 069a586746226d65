"""Boot catch-up: one run for each static schedule that missed more than a full interval.

When the worker role's loops process starts, its scheduler loop's first tick looks at every
enabled synced beat row and its `scheduler_state`: if more than one full interval passed
since `last_fired_at` (a cron: a moment the expression names passed since the last fire),
it fires the current slot once, with `catchUp: true` in the trigger.

Exactly once, with any number of replicas booting together: each fires the same slot
through `fire.fire`, so one takes `lock:scheduler:<taskId>:<bucket>` and the claim of the
slot in `scheduler_state` stops any later one. Beat itself also fires an overdue row when it
starts; that fire lands in the same slot and fires nothing more.

Costs two queries (the rows, their states). A schedule that never fired (no state) is not
caught up: it waits for its first regular fire. Each schedule is handled alone: one that
fails is logged with its task id and the others go on.

A schedule declared with `catch_up_within_s` (`every()`, `cron()`) is caught up only when its
latest slot began at most that long ago; one whose slot is older waits for its next fire.

Not guaranteed: a catch-up replaces every missed slot with one run; it does not replay them
(an operator's backfill does: `scheduler.backfill`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django_celery_beat.models import PeriodicTask

from orchestrator.clock import SYSTEM, Clock
from orchestrator.models import SchedulerState
from orchestrator.scheduler import policies
from orchestrator.scheduler.fire import FireRequest, Outcome, fire
from orchestrator.scheduler.names import DISPATCH_TASK, state_key
from orchestrator.scheduler.sync import slots_of

log = logging.getLogger(__name__)


@dataclass
class CatchUpReport:
    fired: list[str] = field(default_factory=list)
    # Due, but another replica took the bucket or the slot was already fired.
    elsewhere: list[str] = field(default_factory=list)
    # Missed, but its latest slot began longer ago than its `catch_up_within_s`.
    outside: list[str] = field(default_factory=list)
    errors: int = 0


def catch_up(clock: Clock = SYSTEM) -> CatchUpReport:
    report = CatchUpReport()
    now = clock.now()
    rows = list(
        PeriodicTask.objects.select_related("interval", "crontab").filter(
            task=DISPATCH_TASK, enabled=True
        )
    )
    states = {
        s.key: s for s in SchedulerState.objects.filter(key__in=[state_key(r.name) for r in rows])
    }
    for row in rows:
        state = states.get(state_key(row.name))
        try:
            slots = slots_of(row)
            if slots is None or state is None or state.last_fired_at is None:
                continue
            if not slots.missed(state.last_fired_at, now):
                continue
            slot = slots.slot(now)
            within = policies.of(row.name).catch_up_within_s
            if within is not None and now.timestamp() - slot > within:
                report.outside.append(row.name)
                continue
            result = fire(FireRequest(row.name, slot, catch_up=True), now)
        except Exception:
            report.errors += 1
            log.exception("boot catch-up of schedule %s failed; the others go on", row.name)
            continue
        if result.outcome is Outcome.FIRED or result.outcome is Outcome.REFUSED:
            report.fired.append(row.name)
        else:
            report.elsewhere.append(row.name)
    if report.fired or report.errors:
        log.info(
            "boot catch-up: fired %s; %d errors", ", ".join(report.fired) or "none", report.errors
        )
    return report
