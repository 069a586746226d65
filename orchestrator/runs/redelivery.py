"""What a delivered message means when its run is not pending: a duplicate of an ended run,
a cancel before pickup, a pipeline under way, or a run whose worker died mid-run (put back or
ended here); and the end of a message redelivered past LUMASTRA_MAX_DELIVERIES. The runner's
paths that read the row first (`runs.runner`) hand such a row here; and a claim Valkey holds
for a dead or silent worker that Postgres never heard of, written for it so the lost attempt
counts (`write_abandoned_claim`)."""

from __future__ import annotations

import logging
from typing import cast

from django.conf import settings
from django.db import connection

from orchestrator.cluster.instance import is_dead_here
from orchestrator.models import TaskHistory
from orchestrator.runs import catch_up, put_back, retries, terminal
from orchestrator.states import TERMINAL_RUN_STATES, RunState
from orchestrator.stores import counters, live, queries, valkey
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)


def not_pending(definition: TaskDefinition, row: TaskHistory) -> None:
    """A message whose run the row says is not pending: dealt with, never run here."""
    if row.state == RunState.CANCELLING and row.owner_instance_id == "":
        # Cancelled before pickup: the claim refuses it and the cancel completes here.
        terminal.cancel(definition, row.id)
    elif row.state in TERMINAL_RUN_STATES:
        log.info("run %s: already %s; duplicate message dropped", row.id, row.state)
        counters.add(counters.DELIVERY, ("duplicate_dropped",))
    elif definition.pipeline and row.state == RunState.ACTIVE:
        # Its stages carry it now; one whose first dispatch a crash cut short is moved on by
        # recovery.stages.
        log.info("run %s: pipeline under way; its run message again dropped", row.id)
    elif (dead := is_dead_here(row.owner_instance_id)) or _heartbeat_is_stale(row):
        # Redelivered because its worker died mid-run (reject on worker lost), and nobody
        # is beating for it: put it back or end it here rather than wait for the reconciler.
        # Written as the dead owner, so its fence matches and its concurrency slot is freed.
        owner = row.owner_instance_id
        why = f"worker {owner} stopped mid-run"
        if row.state == RunState.CANCELLING:
            error = retries.error_doc(ErrorKind.WORKER_LOST, why)
            terminal.cancel(definition, row.id, owner, error=error)
        elif dead or not put_back.may_put_back(definition, row.attempts):
            lost = put_back.Lost(row.id, owner, row.attempts, row.identity, row.priority)
            put_back.put_back_or_fail(definition, lost, why)
        else:
            # Silent in Postgres only, on another host: it may be alive and cut off, and a
            # new attempt must not run beside it. The reconciler puts it back once both
            # stores agree it is gone (`recovery.orphans`).
            log.info("run %s: redelivered, owner %s silent; left to the reconciler", row.id, owner)
    else:
        log.info("run %s: redelivered while %s with a live owner; dropped", row.id, row.state)


def give_up(definition: TaskDefinition, row: TaskHistory, deliveries: int) -> None:
    """A message that keeps coming back: its run ends here as a lost worker's."""
    error = retries.error_doc(
        ErrorKind.WORKER_LOST,
        f"message redelivered {deliveries} times (LUMASTRA_MAX_DELIVERIES); giving up",
    )
    if row.state == RunState.PENDING:
        terminal.fail_unstarted(definition, row.id, ErrorKind.WORKER_LOST, error["message"])
    elif row.state == RunState.CANCELLING:
        terminal.cancel(definition, row.id, row.owner_instance_id, error=error)
    else:
        terminal.end(definition, row.id, row.owner_instance_id, RunState.FAILED, error=error)


def _heartbeat_is_stale(row: TaskHistory) -> bool:
    """Older than three heartbeat intervals by the Postgres clock (the one definition:
    `lumastra_heartbeat_stale`); False for a run Postgres does not have."""
    stale_s = 3 * settings.CONFIG.heartbeat_interval_s
    with connection.cursor() as cursor:
        cursor.execute(queries.HEARTBEAT_STALE, {"run_id": row.id, "stale_s": stale_s})
        found = cursor.fetchone()
    return found is not None and bool(found[0])


def write_abandoned_claim(run_id: str) -> bool:
    """Valkey says a worker claimed this run, Postgres (which we just read) says pending, and
    that claimer is a dead process of this host, or its claim never heartbeat and is older
    than a heartbeat interval (a plain run's claim reaches Postgres after a second, the watch's
    `CLAIM_AFTER_S`): it died before Postgres heard of its claim, perhaps mid-run. Its claim
    is written for it (`catch_up.write_live_claim`, as of its last sign of life), so the lost
    attempt counts. False when the claim is live, or someone else moved the run first."""
    snapshot = live.read(run_id)
    owner = snapshot.get("owner", "")
    if not is_dead_here(owner) and not _silent_since_claim(snapshot):
        return False
    if catch_up.write_live_claim(run_id, owner) is None:
        return False
    log.warning("run %s: claim by %s abandoned before Postgres heard of it", run_id, owner)
    return True


def _silent_since_claim(snapshot: live.RunHash) -> bool:
    claimed_ms = snapshot.get("started_at")
    beat_ms = snapshot.get("heartbeat_at")
    # A heartbeat older than the claim is an earlier attempt's (a run put back to pending).
    if not claimed_ms or (beat_ms and int(str(beat_ms)) >= int(claimed_ms)):
        return False
    now_ms = valkey.time_ms(cast(tuple[int, int], valkey.client().time()))
    return now_ms - int(claimed_ms) >= settings.CONFIG.heartbeat_interval_s * 1000
