"""A start's admission: whether a run may be recorded, asked of Valkey in one round trip.

`admit` is what `start_run` and `start_runs` ask, in this order:

1. The admission script (`admit_run.lua`) counts the start in its task's day (a task without
   a cap) and says whether a pause or the circuit must judge it. A task whose plan has
   admission hooks (dedup, a capped quota, a cost cap) sends it first in their pipeline
   (`hooks.dispatch.admit`); any other sends it alone, and runs no hook code unless the
   script asks (`hooks.dispatch.admit_asked`).
2. The queue cap (backpressure), last, so a refused start consumes nothing and nothing is
   shed for a start the hooks refuse. A resource class's waiting messages are capped, and a
   task's policy says what a start does at the cap:
   - `drop`: the start is recorded as a run cancelled with kind `dropped` and never enqueued;
     `start_run` returns it with `dropped=True`.
   - `fail-fast`: the start is refused with `QueueFull` (HTTP 503 with Retry-After).
   - `shed-oldest`: the least urgent, oldest waiting messages of the class (never one more
     urgent than the new run) are removed from the broker and their runs cancelled with kind
     `shed`; if nothing can be shed, the start is refused like fail-fast.
   A refusal here gives back what the script and the hooks took (`hooks.dispatch.abandon`).

Depth is read from the broker (LLEN of each queue's priority lists, one round trip of five
commands per queue of the class) against `LUMASTRA_QUEUE_DEPTH_CAP_<CLASS>`
(`routing.class_limit`). A process keeps its last reading for DEPTH_FRESH and counts its own
admitted starts on top of it; while that estimate is at most half the cap, a start is
admitted without reading again. Near the cap every start reads the depth afresh.

Not guaranteed: the check and the enqueue are not one atomic step, so concurrent starts can
overshoot the cap by at most the number of starters; and a reading kept for DEPTH_FRESH does
not see other processes' starts, so they would have to add half the cap within DEPTH_FRESH
(2,000 a second under the default cap of 2,000 in io) to push the depth past it unread.
The cap only takes the shed messages out of the broker and records their runs in
`Admission.shed`; `start_run` cancels them when its transaction commits. If it rolls back
instead, their runs stay pending without a message, for the reconciler to re-publish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks import dispatch
from orchestrator.hooks.base import Admission, Dropped, Refused, Shed
from orchestrator.routing import ClassLimit, class_limit
from orchestrator.stores import broker, live
from tasks import registry
from tasks.definition import Backpressure

# A full queue drains at the pool's pace; a few seconds is a polite first retry.
RETRY_AFTER = timedelta(seconds=5)
# How long a depth reading stands in for the next ones while far below the cap.
DEPTH_FRESH = timedelta(milliseconds=250)


class QueueFull(Refused):
    code = "queue_full"
    http_status = 503


def admit(admission: Admission) -> None:
    """Admit the start, or raise what refused it (`Refused`), dropped it (`Dropped`) or
    answered it with a live run (`hooks.base.Deduplicated`)."""
    definition = admission.definition
    plan = dispatch.plans.get(definition.id)
    if plan is None or plan.definition is not definition or plan.admit:
        dispatch.admit(admission)
    elif (
        live.admit(
            definition.id,
            live.Pauses.of(definition.id, definition.resource_class),
            not definition.quotas.capped,
        )
        and plan.admit_all
    ):
        dispatch.admit_asked(admission)
    try:
        QUEUE_CAP.judge(admission)
    except (Refused, Dropped) as refused:
        dispatch.abandon(admission)
        dispatch.refuse(admission, refused)
        raise


@dataclass
class _Reading:
    depth: int
    at: datetime
    limit: ClassLimit  # the cap and queues it was judged by, kept while `source` stands
    source: tuple[object, object]  # the configuration and registry `limit` came from
    admitted: int = 0  # starts this process admitted since


@dataclass
class QueueCap:
    """The queue cap, with this process's last depth reading per resource class."""

    clock: Clock = SYSTEM
    _readings: dict[str, _Reading] = field(default_factory=dict, repr=False)

    def judge(self, admission: Admission) -> None:
        if admission.not_before is not None:
            return  # not queued until its time: today's depth says nothing of it
        definition = admission.definition
        source = (settings.CONFIG, registry.get())
        reading = self._readings.get(definition.resource_class)
        if (
            reading is None
            or reading.source[0] is not source[0]
            or reading.source[1] is not source[1]
        ):
            limit = class_limit(definition.resource_class)  # first, or the cap may have changed
        elif self._far_below(reading):
            return
        else:
            limit = reading.limit
        cap, queues = limit.cap, list(limit.queues)
        waiting = broker.depth(queues)
        reading = _Reading(waiting, self.clock.now(), limit, source)
        self._readings[definition.resource_class] = reading
        if waiting < cap:
            reading.admitted = 1
            return
        full = (
            f"the {definition.resource_class!r} queue holds {waiting} waiting runs, "
            f"at its cap of {cap}"
        )
        if definition.backpressure is Backpressure.DROP:
            raise Dropped(f"{full}; task {definition.id!r} drops new starts")
        if definition.backpressure is Backpressure.SHED_OLDEST:
            shed = broker.shed_oldest(queues, waiting - cap + 1, admission.priority)
            if shed:
                reason = f"shed to make room for run {admission.run_id} ({full})"
                admission.shed.append(Shed(shed, reason))
                return
        raise QueueFull(f"{full}; retry later", retry_after=RETRY_AFTER)

    def _far_below(self, reading: _Reading) -> bool:
        """A fresh reading, with this process's starts since, says the class is at most half
        full: this start is admitted without reading again (and counted on the reading)."""
        if self.clock.now() - reading.at >= DEPTH_FRESH:
            return False
        if reading.depth + reading.admitted + 1 > reading.limit.cap // 2:
            return False
        reading.admitted += 1
        return True


QUEUE_CAP = QueueCap()
