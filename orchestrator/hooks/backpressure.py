"""Backpressure: a resource class's waiting messages are capped, and a task's policy says
what a start does at the cap.

- `drop`: the start is recorded as a run cancelled with kind `dropped` and never enqueued;
  `start_run` returns it with `dropped=True`.
- `fail-fast`: the start is refused with `QueueFull` (HTTP 503 with Retry-After).
- `shed-oldest`: the least urgent, oldest waiting messages of the class (never one more
  urgent than the new run) are removed from the broker and their runs cancelled with kind
  `shed`; if nothing can be shed, the start is refused like fail-fast.

Depth is read from the broker (LLEN of each queue's priority lists, one round trip of five
commands per queue of the class) against `LUMASTRA_QUEUE_DEPTH_CAP_<CLASS>`. A process keeps
its last reading for DEPTH_FRESH and counts its own admitted starts on top of it; while that
estimate is at most half the cap, a start is admitted without reading again. Near the cap
every start reads the depth afresh.

Not guaranteed: the check and the enqueue are not one atomic step, so concurrent starts can
overshoot the cap by at most the number of starters; and a reading kept for DEPTH_FRESH does
not see other processes' starts, so they would have to add half the cap within DEPTH_FRESH
(2,000 a second under the default cap of 2,000 in io) to push the depth past it unread.
The hook only takes the shed messages out of the broker and records their runs in
`Admission.shed`; `start_run` cancels them when its transaction commits. If it rolls back
instead, their runs stay pending without a message, for the reconciler to re-publish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks.base import Admission, Dropped, Part, Refused, RunHook, Shed
from orchestrator.routing import class_queues
from orchestrator.stores import broker
from tasks import registry
from tasks.definition import Backpressure
from tasks.resources import budgets

# A full queue drains at the pool's pace; a few seconds is a polite first retry.
RETRY_AFTER = timedelta(seconds=5)
# How long a depth reading stands in for the next ones while far below the cap.
DEPTH_FRESH = timedelta(milliseconds=250)


class QueueFull(Refused):
    code = "queue_full"
    http_status = 503


@dataclass(frozen=True)
class ClassLimit:
    cap: int  # LUMASTRA_QUEUE_DEPTH_CAP_<CLASS> or the class's default
    queues: tuple[str, ...]  # every queue whose messages count toward the class's depth


# Computed once per (configuration, registry) rather than on every start: both are replaced,
# never changed in place (settings at startup or by a test; the registry once at startup).
_limits: tuple[object, object, dict[str, ClassLimit]] | None = None


def class_limit(resource_class: str) -> ClassLimit:
    """The cap and the queues a start of `resource_class` is judged by."""
    global _limits
    config, tasks = settings.CONFIG, registry.get()
    known = _limits
    if known is None or known[0] is not config or known[1] is not tasks:
        caps = budgets(config.concurrency_overrides, config.queue_depth_cap_overrides)
        known = _limits = (
            config,
            tasks,
            {
                name: ClassLimit(
                    budget.queue_depth_cap,
                    tuple(class_queues(tasks.values(), name, config.per_task_queues)),
                )
                for name, budget in caps.items()
            },
        )
    return known[2][resource_class]


@dataclass
class _Reading:
    depth: int
    at: datetime
    admitted: int = 0  # starts this process admitted since


@dataclass
class QueueCap(RunHook):
    name: str = "backpressure"
    clock: Clock = SYSTEM
    # The last depth read per resource class, in this process.
    _readings: dict[str, _Reading] = field(default_factory=dict, repr=False)

    def plan_admit(self, admission: Admission) -> Part | None:
        if admission.not_before is not None:
            return None  # not queued until its time: today's depth says nothing of it
        # After the hooks before it answered: nothing is shed for a start they refuse.
        return Part(lambda replies: self._judge(admission), after_replies=True)

    def _far_below(self, resource_class: str, cap: int) -> bool:
        """A fresh reading, with this process's starts since, says the class is at most half
        full: this start is admitted without reading again (and counted on the reading)."""
        reading = self._readings.get(resource_class)
        if reading is None or self.clock.now() - reading.at >= DEPTH_FRESH:
            return False
        if reading.depth + reading.admitted + 1 > cap // 2:
            return False
        reading.admitted += 1
        return True

    def _judge(self, admission: Admission) -> None:
        definition = admission.definition
        limit = class_limit(definition.resource_class)
        cap, queues = limit.cap, list(limit.queues)
        if self._far_below(definition.resource_class, cap):
            return
        waiting = broker.depth(queues)
        reading = self._readings[definition.resource_class] = _Reading(waiting, self.clock.now())
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
