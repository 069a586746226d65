"""Pending runs whose message the broker may have lost: published again, or failed at a deadline.

A run is `pending` from its INSERT until a worker claims it, and its message can go missing:
a crash between the commit and the publish (`start_run` publishes on commit), a broker that
restarted without persistence, a message purged by hand. For each run pending for longer than
LUMASTRA_PENDING_CHECK_AFTER_S (counted from its creation or from being put back for a retry,
and from its retry time if that is later), by the Postgres clock:

- Past LUMASTRA_PENDING_DEADLINE_S it is failed (pending → failed, kind `orphaned`) whether
  or not a message still waits: a run that has waited that long is stuck, not queued.
- Otherwise its message is looked for: waiting in one of its queue's priority lists (read in
  slices on the broker by `lua/broker_run_ids.lua`, which returns run ids only), or held by a
  worker (kombu's `unacked` hash: taken and not acknowledged, which is also where a delayed
  retry or a postponed run waits), or, for a keyed-concurrency run, waiting for its key's turn
  (`hooks.keyed`). Found: nothing to do. Missing: the run is published again
  with `orchestrator.runs.publish.publish`, with its priority and job id. A duplicate is harmless:
  only one delivery can claim the run.
- A message a worker took more than `stranded_after_s()` ago (the pending-check delay, at
  least twice the longest broker delay) for a run that is still pending counts as missing:
  its worker died between taking it and claiming the run, or its acknowledgement was lost
  with a Valkey restart. kombu would give it back only after the visibility timeout (an hour
  by default) and its own restore cadence (about every 100 s); the run is published again
  instead, and the stranded copy is dropped by the claim when kombu restores it.
- If Valkey lost its live hash, the hash is seeded again and marked (`live.reseed`), and the
  run is published (if its message is still missing) only once the mark, a heartbeat interval
  and a store timeout, has run out (no other delivery claims it meanwhile either): a worker may
  be running it with its Postgres claim not written yet (a plain run's claim waits a second,
  `runs.watch.CLAIM_AFTER_S`), and publishing it sooner could run it twice; by then that
  worker's Valkey beat has found its claim gone and written it to Postgres (or stopped, if
  Postgres gave the run to nobody: `runs.watch`).
- A live hash that names a claimer (active, cancelling) while Postgres says pending is a claim
  not written to Postgres yet (a plain run's, for its first second: `runs.runner`) or whose
  commit a crash of Postgres lost (the claim does not wait for its flush:
  `stores/sql/claim_run.sql`). While its claimer's Valkey heartbeat is within the orphan
  threshold the run is running: it is neither published again nor failed at the deadline
  (counted `claimed`); its owner claims it again at its next heartbeat, and its end takes the
  claim with it (`durable.end`). A silent claimer's claim is written for it, as of its last
  heartbeat (`silent_claims`): the run is then an orphan, put back by the next orphan pass with
  its lost attempt counted (or failed, by its task's policy), rather than left until the
  deadline or run again uncounted.

A run recorded for an older processing_version is failed as `stale_version`, which is what the
runner would do with its message; one recorded for a newer version is left to a newer deploy.

Options: LUMASTRA_PENDING_CHECK_AFTER_S, LUMASTRA_PENDING_DEADLINE_S and the orphan threshold
(the reconciler passes them); SLICE below.

Not guaranteed:
- When a message was taken is the taking worker's clock (kombu's `unacked_index`), compared
  with this host's: clock skew between hosts shifts `stranded_after_s()` by the skew.
- The lists are read before the unacked hash, so a message a worker takes during the check is
  still found. A message caught between a worker's BRPOP and its unacked write, or restored
  from unacked to a list at that instant, is missed, and the run is published twice
  (harmless, see above).
- The scan's cost on the broker grows with the depth of the queues it reads (in slices of
  SLICE messages, so no single call blocks the broker for long); the unacked hash is read in
  full.
- A run of a task no longer registered cannot be published; it waits for the deadline.
- Only kombu's Redis transport is inspected.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from django.conf import settings

from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.locks import Fence, LockLost
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks import keyed
from orchestrator.hooks.base import Republished
from orchestrator.models import TaskHistory
from orchestrator.recovery.orphans import Candidate, LiveView, live_views
from orchestrator.routing import queue_name
from orchestrator.runs import retries, terminal
from orchestrator.runs.catch_up import write_live_claim
from orchestrator.runs.ending import End, Guard, Written
from orchestrator.runs.publish import MAX_BROKER_DELAY, publish
from orchestrator.states import RunState
from orchestrator.stores import broker, keys, live, valkey
from orchestrator.stores.broker import job_id
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

SLICE = 1000


@dataclass
class PendingReport:
    waiting: int = 0  # its message is in the broker
    republished: int = 0
    reseeded: int = 0  # live hash seeded again
    failed: int = 0  # past the deadline
    stale_version: int = 0
    skipped: int = 0  # task not registered, or recorded for a newer version
    claimed: int = 0  # Postgres lost its claim, and its owner still beats in Valkey: left alone
    # the same, its owner silent: its claim written to Postgres, for the orphan pass to put back
    silent_claims: int = 0
    raced: int = 0  # changed between the query and the write: left alone
    settling: int = 0  # its hash seeded again lately: published once the seed has settled
    errors: int = 0  # logged with the run id


@dataclass(frozen=True)
class _Failure:
    candidate: Candidate
    kind: ErrorKind
    message: str
    older_than_s: int


def check(
    pending: Sequence[Candidate],
    *,
    deadline_s: int,
    claim_stale_after_s: int,
    fence: Fence,
    clock: Clock = SYSTEM,
) -> PendingReport:
    """Fail the expired runs, re-publish those whose message is missing; each run alone. A run
    whose live hash says a worker claimed it is judged by that worker's Valkey heartbeat:
    beating within `claim_stale_after_s` (the orphan threshold), it runs (see the module
    docstring) and is left alone; silent, its hash goes back to pending first."""
    report = PendingReport()
    definitions = registry.get()
    views = live_views([c.run_id for c in pending]) if pending else {}
    failures: list[_Failure] = []
    to_look_for: list[tuple[Candidate, TaskDefinition]] = []
    for candidate in pending:
        view = views[candidate.run_id]
        if isinstance(view, Exception):
            report.errors += 1
            log.error("run %s: live hash unreadable (%s); not judged", candidate.run_id, view)
            continue
        if view.state in (RunState.ACTIVE, RunState.CANCELLING):
            if view.stale_reason(claim_stale_after_s) is None:
                report.claimed += 1
                # Info, not a warning: a claim whose Postgres half is still in flight (a few
                # ms after the Lua claim) reads the same as one a crash of Postgres lost.
                log.info(
                    "run %s: pending in Postgres, claimed by %s in Valkey and beating: its "
                    "Postgres claim is in flight or was lost; its owner claims it again",
                    candidate.run_id,
                    view.owner,
                )
                continue
            try:
                fence.check()
                if _write_silent_claim(candidate.run_id, view):
                    report.silent_claims += 1
                    continue
            except LockLost:
                raise
            except Exception:
                report.errors += 1
                log.exception("run %s: silent claim not written", candidate.run_id)
                continue
        definition = definitions.get(candidate.task_id)
        if candidate.age_s >= deadline_s:
            message = (
                f"pending for {candidate.age_s:.0f}s, past the pending deadline of "
                f"{deadline_s}s: no worker took it"
            )
            failures.append(_Failure(candidate, ErrorKind.ORPHANED, message, deadline_s))
        elif definition is None:
            report.skipped += 1
            log.warning(
                "run %s: task %r is not registered; not published",
                candidate.run_id,
                candidate.task_id,
            )
        elif candidate.processing_version > definition.processing_version:
            report.skipped += 1
            log.info(
                "run %s: recorded for processing_version %s, this deploy has %s; left alone",
                candidate.run_id,
                candidate.processing_version,
                definition.processing_version,
            )
        elif candidate.processing_version < definition.processing_version:
            message = (
                f"enqueued for processing_version {candidate.processing_version}, "
                f"current is {definition.processing_version}"
            )
            failures.append(_Failure(candidate, ErrorKind.STALE_VERSION, message, 0))
        else:
            to_look_for.append((candidate, definition))

    for failure in failures:
        try:
            fence.check()
            ended = _fail(failure, clock)
        except LockLost:
            raise
        except Exception:
            report.errors += 1
            log.exception("run %s: could not fail the pending run", failure.candidate.run_id)
            continue
        if not ended:
            report.raced += 1
        elif failure.kind is ErrorKind.STALE_VERSION:
            report.stale_version += 1
        else:
            report.failed += 1

    if to_look_for:
        _look_for_messages(to_look_for, views, report, fence, clock)
    return report


def _look_for_messages(
    to_look_for: list[tuple[Candidate, TaskDefinition]],
    views: Mapping[str, LiveView | Exception],
    report: PendingReport,
    fence: Fence,
    clock: Clock,
) -> None:
    queues = {queue_name(d, settings.CONFIG.per_task_queues) for _, d in to_look_for}
    # Lists first, then the unacked hash: a message taken meanwhile is found in the second.
    in_broker = in_broker_lists(queues)
    in_broker |= held_by_workers(taken_within_s=stranded_after_s())
    # Keyed-concurrency runs wait for their key's turn, not in the broker (`hooks.keyed`).
    in_broker |= keyed.tracked({d.id for _, d in to_look_for if d.concurrency is not None})
    for candidate, definition in to_look_for:
        run_id = candidate.run_id
        has_hash = _has_hash(views[run_id])
        if has_hash and run_id in in_broker:
            report.waiting += 1
            continue
        try:
            fence.check()
            if not has_hash and _reseed(candidate, definition, clock):
                hooks.republished(Republished(definition, run_id, candidate.identity))
                report.reseeded += 1
                # Not published yet: a worker may run it with its Postgres claim not written
                # yet (for about `runs.watch.CLAIM_AFTER_S`), its hash lost with a Valkey
                # restart. Published once the seed has settled (below), if still pending then.
                continue
            if run_id in in_broker:
                report.waiting += 1
                continue
            if valkey.client().exists(keys.run_reseeded(run_id)):
                report.settling += 1
                continue
            # Its start may not have reached Valkey after its commit: the identity too.
            hooks.republished(Republished(definition, run_id, candidate.identity))
            publish(
                definition,
                run_id,
                job_id(candidate.task_id, candidate.identity, run_id),
                candidate.priority,
            )
        except LockLost:
            raise
        except Exception:
            report.errors += 1
            log.exception("run %s: pending check failed; the next tick tries again", run_id)
            continue
        report.republished += 1
        log.warning(
            "run %s: pending for %.0fs and its message is not in the broker; published again",
            run_id,
            candidate.age_s,
        )


def in_broker_lists(queues: Iterable[str]) -> set[str]:
    """Run ids of the messages waiting in `queues` (every priority list of each)."""
    client = broker.client()
    found: set[str] = set()
    for queue in queues:
        for step in keys.BROKER_PRIORITY_STEPS:
            name = keys.broker_queue(queue, step)
            start = 0
            while True:
                ids = valkey.script(
                    "broker_run_ids", [name], [start, start + SLICE - 1], client=client
                )
                found.update(str(run_id) for run_id in ids if run_id)
                if len(ids) < SLICE:
                    break
                start += SLICE
    return found


def stranded_after_s() -> float:
    """How long a worker may hold the message of a run that stays pending: the pending-check
    delay, and at least twice the longest delay a message waits in a worker (a retry's or a
    postponement's countdown)."""
    return max(float(settings.CONFIG.pending_check_after_s), 2 * MAX_BROKER_DELAY.total_seconds())


def held_by_workers(taken_within_s: float | None = None) -> set[str]:
    """Run ids of the messages workers have taken and not acknowledged (kombu's unacked hash:
    delivery tag → JSON [message, exchange, routing key]); with `taken_within_s`, only those
    taken that recently (kombu's unacked_index; an entry missing there counts as recent)."""
    client = broker.client()
    stranded: set[str] = set()
    if taken_within_s is not None:
        before = time.time() - taken_within_s
        tags = client.zrangebyscore(keys.BROKER_UNACKED_INDEX, "-inf", before)
        stranded = set(cast(list[str], tags))
    found: set[str] = set()
    for tag, value in client.hscan_iter(keys.BROKER_UNACKED, count=500):
        if tag in stranded:
            continue
        try:
            message = json.loads(value)[0]
            if isinstance(message, str):
                message = json.loads(message)
            task_id = message["headers"]["id"]
        except (ValueError, KeyError, TypeError, IndexError):
            continue
        if isinstance(task_id, str) and "#" in task_id:
            found.add(task_id.rpartition("#")[2])
    return found


def _has_hash(view: LiveView | Exception) -> bool:
    return not isinstance(view, Exception) and view.state is not None


def _reseed(candidate: Candidate, definition: TaskDefinition, clock: Clock) -> bool:
    """Seed the lost live hash of a run Postgres still calls pending (read again just before:
    a run that ended meanwhile must not get a pending hash back)."""
    state = TaskHistory.objects.filter(id=candidate.run_id).values_list("state", flat=True).first()
    if state != RunState.PENDING or valkey.client().exists(keys.run_terminal(candidate.run_id)):
        return False
    # Marked, and not published until the mark runs out: a worker that held a claim Valkey
    # forgot has by then found it gone at its Valkey beat and claimed it back, so the run is no
    # longer pending (`runs.watch`). Published sooner, it could start a second execution
    # beside that worker (found in the battery: a Valkey restart, then a publish 1 s later).
    seeded = live.reseed(
        candidate.run_id, candidate.task_id, candidate.priority, definition.stage_order, clock
    )
    if seeded:
        log.warning("run %s: live hash was missing; seeded again from Postgres", candidate.run_id)
    return seeded


def _write_silent_claim(run_id: str, view: LiveView) -> bool:
    """The live hash names a claim Postgres does not have (not written yet, or lost in a crash
    of Postgres) whose owner stopped beating: the claim is written for it, as of its last
    heartbeat (`runs.catch_up.write_live_claim`), so the run is an orphan like any other,
    its lost attempt counted: the orphan pass puts it back, or fails it by its task's policy."""
    if write_live_claim(run_id, view.owner) is None:
        log.info("run %s: silent claim not written (moved meanwhile)", run_id)
        return False
    log.warning(
        "run %s: pending in Postgres, claimed by %s in Valkey, %s; claim written for the "
        "orphan pass",
        run_id,
        view.owner,
        view.stale_reason(0),
    )
    return True


def _fail(failure: _Failure, clock: Clock) -> bool:
    """pending → failed by compare-and-set, Postgres first; False when the run moved on."""
    candidate = failure.candidate
    end = End(
        candidate.run_id,
        candidate.task_id,
        RunState.FAILED,
        error=retries.error_doc(failure.kind, failure.message),
        guard=Guard.PENDING_DEADLINE,
        stale_after_s=failure.older_than_s,
    )
    if terminal.finish(end, clock=clock).written is Written.SUPERSEDED:
        log.info("run %s: no longer pending as judged; left alone", candidate.run_id)
        return False
    log.warning("run %s: failed (%s): %s", candidate.run_id, failure.kind.value, failure.message)
    return True
