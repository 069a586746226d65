"""The one fire path: beat's dispatch, the dynamic tick and the boot catch-up all end here.

`fire(request, now)`:
1. `SET lock:scheduler:<taskId>:<bucket> NX EX 30`: of several replicas firing one bucket at
   once, one goes on; the others return `LOCKED` after one Valkey call;
2. in one transaction: claim the slot in `scheduler_state` (`sql/claim_slot.sql`: a guarded
   upsert, `last_bucket < slot`), then `start_run(..., trigger={"kind": "schedule",
   "bucket": ...})` in a savepoint, then record the run id. A slot already claimed returns
   `ALREADY` and starts nothing: this is what keeps a slot to one run after the 30 s lock
   expired (a beat message delivered late, a replica booting a minute later).

A schedule never stacks by default: a slot whose previous fire's run is still live
(`scheduler_state.last_run_id` pending, active or cancelling) is claimed and starts nothing,
recorded as skipped (`last_error` names the live run, `last_run_id` keeps it so the next slot
checks it again, a log line, `lumastra_schedule_skips_total`). A task that wants its fires to
start anyway says `overlap="queue"` or `"allow"` (`tasks.definition.Overlap`).

A start that admission refuses (circuit open, quota, backpressure) or whose input the task
rejects still claims the slot: the reason is kept in `scheduler_state.last_error`, logged
with the schedule's key, and the next slot tries again. The lock is never deleted; it runs out.

Not guaranteed: if the process dies after the lock and before the commit, that slot fires
only if another attempt comes within the slot after the lock expired (the dynamic tick
retries every 10 s; beat does not retry). A slot is skipped, never fired twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from django.db import connection, transaction

from orchestrator import sql
from orchestrator.cluster.instance import instance_id
from orchestrator.hooks.base import Refused
from orchestrator.models import SchedulerState, TaskHistory
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.start import start_run
from orchestrator.scheduler.names import BUCKET_LOCK_TTL_S, bucket_label, state_key
from orchestrator.states import LIVE_RUN_STATES
from orchestrator.stores import counters, keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.definition import Overlap
from tasks.registry import UnknownTaskError

log = logging.getLogger(__name__)

CLAIM_SLOT = sql.load(__file__, "claim_slot")


class Outcome(Enum):
    FIRED = "fired"  # a run was started (or a live duplicate returned by dedup)
    LOCKED = "locked"  # another fire holds this bucket's lock right now
    ALREADY = "already"  # this slot was fired before (scheduler_state says so)
    REFUSED = "refused"  # the slot is claimed, but start_run refused; see last_error
    SKIPPED = "skipped"  # the slot is claimed; the previous fire's run is still live
    DECLINED = "declined"  # beat's message for a slot that is not beat's: jittered, or too late


@dataclass(frozen=True)
class FireRequest:
    task_id: str
    slot: int  # the slot's start, epoch seconds
    row_key: str = ""  # "" for a static schedule
    input: Mapping[str, Any] = field(default_factory=dict)
    catch_up: bool = False
    backfill: bool = False  # an operator's backfill (`scheduler.backfill`)

    @property
    def key(self) -> str:
        return state_key(self.task_id, self.row_key)

    @property
    def bucket(self) -> str:
        return bucket_label(self.slot, self.row_key)


@dataclass(frozen=True)
class FireResult:
    outcome: Outcome
    run_id: str = ""
    error: str = ""


def trigger_of(request: FireRequest) -> dict[str, Any]:
    trigger: dict[str, Any] = {
        "kind": TriggerKind.SCHEDULE.value,
        "bucket": request.bucket,
        "slot": datetime.fromtimestamp(request.slot, UTC).isoformat(),
    }
    if request.row_key:
        trigger["row"] = request.row_key
    if request.catch_up:
        trigger["catchUp"] = True
    if request.backfill:
        trigger["backfill"] = True
    return trigger


def still_live(task_id: str, previous: str | None) -> tuple[str, str] | None:
    """The previous fire's run and its state, if it is live and the task does not overlap."""
    if not previous:
        return None
    definition = registry.get().get(task_id)
    if definition is None or definition.overlap is not Overlap.SKIP:
        return None
    state = TaskHistory.objects.filter(id=previous).values_list("state", flat=True).first()
    return (previous, state) if state in LIVE_RUN_STATES else None


def _skip(request: FireRequest, live_run: tuple[str, str]) -> FireResult:
    run_id, state = live_run
    error = f"skipped: run {run_id} of an earlier slot is still {state}"
    SchedulerState.objects.filter(key=request.key).update(last_run_id=run_id, last_error=error)
    counters.add(counters.SCHEDULE_SKIPS, (request.task_id,))
    log.info("schedule %s bucket %s: %s", request.key, request.bucket, error)
    return FireResult(Outcome.SKIPPED, run_id=run_id, error=error)


def fire(request: FireRequest, now: datetime) -> FireResult:
    """Fire one slot of one schedule, at most once across the cluster (see the module doc)."""
    lock = keys.scheduler_lock(request.task_id, request.bucket)
    if not valkey.client().set(lock, instance_id(), nx=True, ex=BUCKET_LOCK_TTL_S):
        return FireResult(Outcome.LOCKED)
    with transaction.atomic():
        # Read under the row's lock before the claim resets it: a concurrent claim waits.
        previous = (
            SchedulerState.objects.select_for_update()
            .filter(key=request.key)
            .values_list("last_run_id", flat=True)
            .first()
        )
        with connection.cursor() as cursor:
            cursor.execute(
                CLAIM_SLOT,
                {
                    "key": request.key,
                    "task_id": request.task_id,
                    "row_key": request.row_key,
                    "slot": request.slot,
                    "fired_at": now,
                },
            )
            claimed = cursor.fetchone() is not None
        if not claimed:
            return FireResult(Outcome.ALREADY)
        if live_run := still_live(request.task_id, previous):
            return _skip(request, live_run)
        try:
            with transaction.atomic():
                handle = start_run(
                    request.task_id, dict(request.input), trigger=trigger_of(request)
                )
        except (StartRefused, Refused, UnknownTaskError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            SchedulerState.objects.filter(key=request.key).update(last_error=error[:2000])
            log.warning(
                "schedule %s bucket %s: no run started: %s", request.key, request.bucket, error
            )
            return FireResult(Outcome.REFUSED, error=error)
        SchedulerState.objects.filter(key=request.key).update(last_run_id=handle.run_id)
    log.info(
        "schedule %s bucket %s: %s %s%s",
        request.key,
        request.bucket,
        "deduplicated into" if handle.deduplicated else "started",
        handle.run_id,
        " (catch-up)" if request.catch_up else "",
    )
    return FireResult(Outcome.FIRED, run_id=handle.run_id)
