"""Per-task rate limit (`quotas.rate`, e.g. "60/m") across every worker and host, in Valkey.

A `RunHook`, in the chain of `orchestrator.apps.hook_chain` after the concurrency limit, for
tasks that call rate-limited external APIs: it applies only to tasks that declare a rate
(`applies`); the runs of others never call it. Unlike Celery's per-worker `rate_limit`, it
holds for the whole cluster and never blocks a worker process.

At pickup (`before_claim`) one Lua script (`lua/rate_take.lua`) keeps a sliding-window log of
the task's admissions (`keys.rate_window`: one sorted-set member per admitted run, scored by
Valkey's clock) and admits the run while fewer than `count` admissions lie within the last
`per`. Otherwise it answers with the exact wait until the admission that frees a place leaves
the window, and the run is postponed by that wait (`Postpone`; the runner re-publishes the
message with that countdown). A run whose claim is then refused, or that a later hook
postpones, gives its admission back (`release`); a run that ran keeps it for the window.

Guaranteed: no interval of length `per` contains more than `count` admissions of runs that
went on to be claimed, whichever workers or hosts admitted them. The window is the count of
real admissions, not a smoothed rate, so a task may use its whole allowance in one burst
(as the APIs it calls usually permit) and then waits for the oldest admission to age out.

Options: the rate comes from the definition. A wait longer than half the broker's visibility
timeout (`LUMASTRA_BROKER_VISIBILITY_TIMEOUT_S`) is taken in steps of that length: a delayed
message is held unacknowledged by a worker, and the broker would deliver it a second time
once the visibility timeout passed.

Not guaranteed:
- Order. Runs told to wait all come back when their wait ends and race for the places then
  free; the others get the next wait. Waiting runs of one task cost one Lua call each per
  freed place, and a run can lose several races in a row.
- Spacing inside the window: `count` admissions may come at once.
- It limits when runs start, not how many calls a run makes or how long it takes.
- The log holds up to `count` members per task, so memory grows with the count (a large
  hourly rate keeps that many entries for an hour).
- An admission is timed when it is granted; the handler starts a little later (the claim,
  the Postgres write), so start times seen by handlers may be closer together by that much.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings

from orchestrator.hooks.base import Part, Pickup, Postpone, RunHook
from orchestrator.stores import keys, valkey
from tasks.definition import TaskDefinition


def member(run_id: str, owner: str) -> str:
    """A run's entry in the window: the owner keeps a second, simultaneous delivery of the
    same run from giving back the admission of the delivery that claimed it."""
    return f"{run_id}|{owner}"


def _longest_wait() -> timedelta:
    return timedelta(seconds=settings.CONFIG.broker_visibility_timeout_s) / 2


@dataclass
class RateLimit(RunHook):
    name: str = "rate"

    def applies(self, definition: TaskDefinition) -> bool:
        return definition.quotas.rate is not None

    def plan_before_claim(self, pickup: Pickup) -> Part | None:
        definition = pickup.definition
        rate = definition.quotas.parsed_rate()
        if rate is None:
            return None
        key = [keys.rate_window(definition.id)]
        args: list[object] = [
            member(pickup.run_id, pickup.owner),
            rate.count,
            rate.per // timedelta(milliseconds=1),
        ]

        def receive(replies: list[Any]) -> None:
            wait_ms = valkey.script_replied("rate_take", key, args, replies[0])
            if wait_ms:
                raise Postpone(
                    min(timedelta(milliseconds=wait_ms), _longest_wait()),
                    f"task {definition.id!r} reached its rate of {definition.quotas.rate}",
                )

        # After the hooks before it answered: a run they postpone takes no admission.
        return Part(
            receive,
            lambda pipe: valkey.queue_script(pipe, "rate_take", key, args),
            after_replies=True,
        )

    def release(self, pickup: Pickup) -> None:
        if pickup.definition.quotas.rate is None:
            return
        valkey.client().zrem(
            keys.rate_window(pickup.definition.id), member(pickup.run_id, pickup.owner)
        )
