"""The release of delayed starts: `start_run(..., not_before=...)` runs, published when due; and
of keyed-concurrency runs whose turn came with nothing else there to publish them
(`release_turns`).

A delayed start is recorded like any run, `pending`, with its `not_before`; it is neither seeded
in Valkey nor published then (a live hash would expire long before a run due in a week, and a
message held by the broker or a worker for that long is one a restart can lose). The cluster
leader's `due` loop asks Postgres every LUMASTRA_DUE_POLL_S for the runs whose time has come
(`release_due.sql`, a partial index of only the waiting ones), releases them in one statement
and commits, then seeds their live hashes and publishes their messages, a round trip each for
the whole batch (`live.seed_many`, `publish.publish_many`). From there a run goes as any other.

Postgres is the only record of what waits, so nothing is lost with a worker, the leader or
Valkey: a new leader finds the same rows. A crash between the release's commit and the publish
leaves a pending run with no message, which the reconciler publishes again once it has been
pending for LUMASTRA_PENDING_CHECK_AFTER_S (`recovery.pending`), counted from the release.

`due_time` says when a start's `not_before` is due, and refuses one beyond
LUMASTRA_MAX_START_DELAY_S.

Options: LUMASTRA_DUE_POLL_S; BATCH, the most runs one look releases (a bigger crowd due at
once takes several looks, one after another).

Not guaranteed:
- Punctuality: a run is published within about one poll interval of its time while a leader
  runs; after the leader dies, within the leader's failover (`cluster.leaders`). Its pickup
  then waits for a free process of its pool like any other run.
- A run cancelled while waiting ends at once (`runs.cancel`) and is never released.
- Admission (quotas, the circuit, exclusivity) was judged when the run was started, not when
  it is released; its identity is held from the start until its time and
  LUMASTRA_IDENTITY_TTL_S after. Backpressure does not judge it (it joins no queue until then),
  and it is never a half-open circuit's probe (refused while the probe slot is free).
- A run recorded for an older `processing_version` than the releasing deploy's is published with
  its own, so its pickup fails it `stale_version` rather than running newer code on it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.locks import Fence
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks import keyed
from orchestrator.hooks.base import Republished
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.publish import Outgoing, publish_turns, seed_and_publish_many
from orchestrator.stores import queries
from orchestrator.stores.broker import job_id
from tasks import registry

log = logging.getLogger(__name__)

BATCH = 500
TURNS_S = 1.0


def due_time(not_before: datetime | timedelta | None, clock: Clock = SYSTEM) -> datetime | None:
    """When a delayed start is due: None for "now" (no delay, or a time already past);
    StartRefused for a time without a zone or beyond LUMASTRA_MAX_START_DELAY_S."""
    if not_before is None:
        return None
    now = clock.now()
    if isinstance(not_before, timedelta):
        due = now + not_before
    elif not_before.tzinfo is None or not_before.utcoffset() is None:
        raise StartRefused("not_before must carry a time zone (e.g. 2026-12-24T18:00:00Z)")
    else:
        due = not_before
    if due <= now:
        return None
    longest = settings.CONFIG.max_start_delay_s
    if (due - now).total_seconds() > longest:
        raise StartRefused(
            f"not_before is {int((due - now).total_seconds())} s ahead; "
            f"at most {longest} s (LUMASTRA_MAX_START_DELAY_S)"
        )
    return due


def release(fence: Fence | None = None, limit: int = BATCH) -> int:
    """Publish the delayed starts whose time has come; returns how many were released."""
    if fence is not None:
        fence.check()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queries.RELEASE_DUE, {"limit": limit})
        rows = cursor.fetchall()
    if not rows:
        return 0
    definitions = registry.get()
    outgoing = []
    for run_id, task_id, identity, priority, version, concurrency_key, traceparent in rows:
        definition = definitions.get(task_id)
        if definition is None:
            # Not registered on this deploy: the run waits for the pending deadline.
            log.error("run %s: task %s is not registered; not published", run_id, task_id)
            continue
        # Held since the start until its time and a TTL after; a lapse (a Valkey that lost
        # it) is closed here, as the pending check does for what it publishes.
        hooks.republished(Republished(definition, run_id, identity))
        job = job_id(task_id, identity, run_id)
        outgoing.append(
            Outgoing(
                definition,
                run_id,
                job,
                priority,
                processing_version=version,
                concurrency_key=concurrency_key,
                traceparent=traceparent,
            )
        )
    seed_and_publish_many(outgoing)
    log.info("released %d delayed starts", len(rows))
    return len(rows)


def release_turns(fence: Fence | None = None) -> int:
    """Publish the keyed-concurrency runs whose key's turn came with no pickup or end there to
    dispatch them (`hooks.keyed`): a holder's lease ran out, or a dispatched run's message was
    not claimed in time (lost). The leader's `turns` loop, every TURNS_S."""
    released = 0
    for definition in registry.get().values():
        if definition.concurrency is not None:
            if fence is not None:
                fence.check()
            turns = keyed.sweep(definition)
            publish_turns(definition, turns)
            released += len(turns)
    return released
