"""Each task's admission state as operators see it, for the API's `/tasks` and the admin.

For every task: its circuit (state, time to half-open, force-enable), today's quota use
against `max_runs_per_day` (with the counts of uncapped tasks not yet rolled up from
Valkey, so without the rollup's lag), today's refusals by code, the waiting messages of its resource
class against the class's cap, the runs holding a concurrency slot against its limit, and
its rate limit. Whatever the number of tasks, one read per source: one Valkey pipeline each
for circuits, refusals, slot holders and uncapped quota counts, one query for quota use (and one
for circuits whose hash Valkey lost), and one broker round trip per resource class among the tasks.

Read-only: nothing here takes, refreshes or repairs anything; an expired lease or a lost
circuit hash is shown as the next write will see it.

Not guaranteed: the sources are read one after another, not at one instant, so a run that
starts or ends meanwhile may be counted in one figure and not yet in another. "Today" is the
UTC day of the clock, as quotas and refusal counts use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks import circuit, concurrency, costs, quotas
from orchestrator.hooks.circuit import CircuitStatus
from orchestrator.routing import class_limit
from orchestrator.stores import broker, keys, valkey
from tasks.definition import TaskDefinition


@dataclass(frozen=True)
class QuotaToday:
    day: date  # UTC
    started: int  # admitted today, refused starts excluded
    completed: int
    failed: int
    max_runs_per_day: int | None  # None: no daily quota
    cost: dict[str, float]  # units spent today, by kind
    max_cost_per_day: dict[str, float]  # the daily cost caps; empty: none


@dataclass(frozen=True)
class QueueDepth:
    resource_class: str
    waiting: int  # messages of every task of the class waiting in the broker
    cap: int


@dataclass(frozen=True)
class Slots:
    running: int  # runs holding a live concurrency lease
    limit: int | None  # None: no limit but the pools' processes


@dataclass(frozen=True)
class TaskStatus:
    task_id: str
    circuit: CircuitStatus
    quota_today: QuotaToday
    refusals_today: dict[str, int]  # refusal code → count
    queue: QueueDepth
    concurrency: Slots
    rate: str | None  # e.g. "60/m"; None: no rate limit


def task_statuses(
    definitions: Sequence[TaskDefinition], *, clock: Clock = SYSTEM
) -> dict[str, TaskStatus]:
    """The status of each of `definitions`, by task id, in their order."""
    ids = [definition.id for definition in definitions]
    today = clock.now().date()
    circuits = circuit.statuses(ids, clock=clock)
    usage = quotas.usage(definitions, today)
    spent = costs.spent(ids, today)
    refused = _refusals(ids, today.isoformat())
    running = concurrency.running(ids)
    depths = _depths({definition.resource_class for definition in definitions})
    statuses: dict[str, TaskStatus] = {}
    for definition in definitions:
        used = usage[definition.id]
        statuses[definition.id] = TaskStatus(
            task_id=definition.id,
            circuit=circuits[definition.id],
            quota_today=QuotaToday(
                day=today,
                started=used.started,
                completed=used.completed,
                failed=used.failed,
                max_runs_per_day=definition.quotas.max_runs_per_day,
                cost=spent[definition.id],
                max_cost_per_day=dict(definition.quotas.max_cost_per_day),
            ),
            refusals_today=refused[definition.id],
            queue=depths[definition.resource_class],
            concurrency=Slots(running[definition.id], concurrency.limit_of(definition)),
            rate=definition.quotas.rate,
        )
    return statuses


def task_status(definition: TaskDefinition, *, clock: Clock = SYSTEM) -> TaskStatus:
    return task_statuses([definition], clock=clock)[definition.id]


def _refusals(task_ids: Sequence[str], day: str) -> dict[str, dict[str, int]]:
    pipe = valkey.client().pipeline(transaction=False)
    for task_id in task_ids:
        pipe.hgetall(keys.refusals(task_id, day))
    counts: list[dict[str, str]] = valkey.execute(pipe)
    return {
        task_id: {code: int(count) for code, count in sorted(found.items())}
        for task_id, found in zip(task_ids, counts, strict=True)
    }


def _depths(resource_classes: Iterable[str]) -> dict[str, QueueDepth]:
    # The same queues and cap as backpressure's admission check, so what is shown here is
    # what the next start of the class is judged by.
    depths = {}
    for name in sorted(resource_classes):
        limit = class_limit(name)
        depths[name] = QueueDepth(name, broker.depth(list(limit.queues)), limit.cap)
    return depths
