"""The runner: the body of every run's Celery task (`on_message`), from a delivered message to a
claimed run.

On pickup: processing_version guard → the pre-claim hooks of the task's plan, if any
(concurrency, rate; a probe's circuit), and the claim in Valkey (owner, pending → active, unless
a pause holds the run), one round trip → the run's input (carried by its first message, else
read from Postgres) → its execution (`runs.execute`: the handler beside its watch thread, then
the terminal write through `runs.terminal`, Postgres first).

A plain run's Postgres claim (pending → active) is folded into its end: its first delivery
reads nothing in Postgres when its start's message carries the row's input, identity and
priority (`runs.publish.Carried`; else it reads them, `durable.read_claimable`, no write), and
the end takes the claim with it (`durable.end`, given the attempt count), so a short run costs
one Postgres statement, its end. A run Postgres cancelled before this pickup and whose Valkey
hash has not heard of it yet runs, and its end is refused: the cancel stands. A run still going
after `watch.CLAIM_AFTER_S` has its claim written by its watch; so does a cancel and a retry,
which move a claimed run. A pipeline run (its stages are claimed against it), a follow-up
task's (a start must see it running: `runs.coalesce`) and the paths that read the row first
claim at once.

The row is read first only for a redelivered message (counted, and judged by its heartbeat
when its run is live), a message of an older processing_version, or when a claim refused or a
hook postponed: then it says what the message is (a duplicate of an ended run, a cancel before
pickup, a retry not yet due, a lost live hash to seed again). A redelivery of a run whose
worker died mid-run puts it back to pending for its next attempt (`runs.put_back`), unless the
task opted out (`retry_on_worker_loss=False`). Database connections are checked before each run
without a round trip and closed after it if broken or too old (`task_connections`).
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from enum import Enum
from typing import Any

from celery import Task
from celery.exceptions import Reject
from django.conf import settings
from django.db import close_old_connections, connections
from django.utils import timezone
from redis.client import Pipeline

from orchestrator.cluster.instance import instance_id
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks.base import Parked, Part, Pickup, Postpone
from orchestrator.models import TaskHistory
from orchestrator.runs import execute, redelivery, terminal
from orchestrator.runs.publish import HOOK_HEADER, Carried, republish
from orchestrator.states import TERMINAL_RUN_STATES, IllegalTransition, RunState
from orchestrator.stores import durable, live
from orchestrator.stores.durable import ClaimedRun
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.errors import ErrorKind
from tasks.policies import WhileActive

log = logging.getLogger(__name__)

# A message from a newer deploy goes back to the queue for a newer worker; the pause keeps
# an all-old pool from spinning on it during a rolling deploy.
REQUEUE_PAUSE_S = 1.0


def on_message(
    task: Task[Any, Any], run_id: str, processing_version: int, carried: Carried | None = None
) -> None:
    """The body of every run's Celery task (`runs.celery_tasks` registers it per task id)."""
    # kombu marks a message it restored after a lost worker or an expired visibility timeout;
    # new messages (retries, postponements) are not counted.
    redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
    notes = task.request.get(HOOK_HEADER) or {}
    run_message(task.name, run_id, processing_version, redelivered, notes, carried)


def run_message(
    task_id: str,
    run_id: str,
    processing_version: int,
    redelivered: bool = False,
    notes: Mapping[str, bool] | None = None,
    carried: Carried | None = None,
) -> None:
    """Run one delivered message; `notes`: what its admission told its pickup hooks
    (`Admission.notes`); `carried`: what a first message carries of the row (`Carried`)."""
    with task_connections():
        definition = registry.get()[task_id]
        _run(definition, run_id, processing_version, redelivered, notes or {}, carried)


def _run(
    definition: TaskDefinition,
    run_id: str,
    processing_version: int,
    redelivered: bool,
    notes: Mapping[str, bool],
    carried: Carried | None = None,
) -> None:
    if processing_version > definition.processing_version:
        time.sleep(REQUEUE_PAUSE_S)
        raise Reject(
            f"run {run_id} needs processing_version {processing_version}, "
            f"this worker has {definition.processing_version}",
            requeue=True,
        )
    if redelivered or processing_version < definition.processing_version:
        _run_from_row(definition, run_id, processing_version, redelivered, notes)
        return
    # A first delivery of a current message: claim without reading the row.
    pickup = Pickup(definition, run_id, instance_id(), notes, carried and carried["input"])
    claim = _LiveClaim(run_id, pickup.owner, definition)
    plan = hooks.plans.get(definition.id)
    if plan is None or plan.definition is not definition:
        plan = hooks.plan(definition)
    if plan.before_claim or notes:
        # The claim goes last in the hooks' pipeline; a postponed pickup gives it back.
        try:
            hooks.before_claim(pickup, last=claim.part())
        except (Postpone, Parked) as wait:
            claim.give_back()
            _postponed_unread(definition, pickup, wait)
            return
        except BaseException:
            claim.give_back()
            raise
    else:
        claim.alone()  # no hook takes part in this pickup: the claim, one command
    claimed: ClaimedRun | _Refusal = _Refusal.HANDLED
    try:
        claimed = _claim_unread(definition, claim, carried)
    finally:
        # A refused or failed claim gives back what the pre-claim hooks took.
        if not isinstance(claimed, ClaimedRun):
            hooks.release(pickup)
    if claimed is _Refusal.READ_ROW:
        _run_from_row(definition, run_id, processing_version, redelivered, notes)
    elif isinstance(claimed, ClaimedRun):
        execute.run_claimed(definition, claimed, pickup)


def _run_from_row(
    definition: TaskDefinition,
    run_id: str,
    processing_version: int,
    redelivered: bool,
    notes: Mapping[str, bool],
) -> None:
    """The paths that read the row first: a redelivery, a stale version, and every first
    delivery whose claim was refused."""
    row = TaskHistory.objects.filter(id=run_id).first()
    if row is None:
        log.error("run %s: message for a run Postgres does not have; dropped", run_id)
        return
    deliveries = live.count_delivery(row.id) if redelivered else 0
    if deliveries >= settings.CONFIG.max_deliveries and row.state not in TERMINAL_RUN_STATES:
        # A message that keeps coming back (its worker dies every time, or a visibility
        # timeout shorter than the run) ends here instead of looping forever.
        redelivery.give_up(definition, row, deliveries)
        return
    if row.state == RunState.PENDING and redelivered and redelivery.write_abandoned_claim(row.id):
        # Back because its claimer died before Postgres heard of its claim: that claim is
        # written now, so the run is a lost worker's (and the slot its claim took is freed)
        # before any hook judges this delivery.
        row.refresh_from_db()
    if row.state != RunState.PENDING:
        redelivery.not_pending(definition, row)
        return
    if processing_version < definition.processing_version:
        terminal.fail_unstarted(
            definition,
            row.id,
            ErrorKind.STALE_VERSION,
            f"enqueued for processing_version {processing_version}, "
            f"current is {definition.processing_version}",
        )
        return
    if row.not_before is not None and row.not_before > timezone.now():
        delay = row.not_before - timezone.now()
        republish(definition, row.id, row.identity, row.priority, delay, notes)
        return

    pickup = Pickup(definition, row.id, instance_id(), notes, row.input)
    try:
        hooks.before_claim(pickup)
    except Postpone as wait:
        _postponed(definition, row.id, row.identity, row.priority, wait.delay, wait.reason, notes)
        return
    except Parked as parked:
        log.info("%s", parked)
        return
    claimed = None
    try:
        claimed = _claim(definition, row, pickup.owner)
    finally:
        # A refused or failed claim gives back what the pre-claim hooks took.
        if claimed is None:
            hooks.release(pickup)
    if claimed is not None:
        execute.run_claimed(definition, claimed, pickup)


def _postponed_unread(definition: TaskDefinition, pickup: Pickup, wait: Postpone | Parked) -> None:
    """A pre-claim hook postponed a first delivery: the row, read now, says whether the run
    still waits (and for what), which the paths that read first know before the hooks. A
    parked run is pending in both stores: what holds it publishes it again."""
    if isinstance(wait, Parked):
        log.info("%s", wait)
        return
    run_id = pickup.run_id
    row = TaskHistory.objects.filter(id=run_id).first()
    if row is None:
        log.error("run %s: message for a run Postgres does not have; dropped", run_id)
        return
    if row.state != RunState.PENDING:
        redelivery.not_pending(definition, row)
        return
    delay = wait.delay
    if row.not_before is not None:
        delay = max(delay, row.not_before - timezone.now())
    _postponed(definition, run_id, row.identity, row.priority, delay, wait.reason, pickup.notes)


def _postponed(
    definition: TaskDefinition,
    run_id: str,
    identity: str,
    priority: int,
    delay: timedelta,
    reason: str,
    notes: Mapping[str, bool],
) -> None:
    """A pre-claim hook postponed the run: published again for later, unless a pause holds
    it (the claim's script, which would park it, was not asked): then parked now, as the
    claim would have, rather than put back again and again while its limit is full."""
    pauses = live.Pauses.of(definition.id, definition.resource_class)
    if held := live.holding(run_id, pauses, priority):
        log.info("%s; parked", held)
        return
    log.info("run %s: postponed %ss (%s)", run_id, delay.total_seconds(), reason)
    republish(definition, run_id, identity, priority, delay, notes)


class _Refusal(Enum):
    """Why a claim did not return a run."""

    HANDLED = "handled"  # dealt with here: a cancel that raced the claim, now ended
    READ_ROW = "read_row"  # the row says why: take the paths that read it first


class _LiveClaim:
    """A first delivery's Valkey claim (`claim_run.lua`, which also reads the pauses): alone,
    or sent as the last command of the pickup hooks' pipeline; its reply is kept for the
    runner to judge once the hooks have."""

    def __init__(self, run_id: str, owner: str, definition: TaskDefinition) -> None:
        self.run_id, self.owner = run_id, owner
        self.pauses = live.Pauses.of(definition.id, definition.resource_class)
        self.taken = False
        self.held: live.Held | None = None  # a pause holds the run
        self.refused: IllegalTransition | None = None  # the run was not pending in Valkey
        self.failed: Exception | None = None  # anything else the script answered
        self._read: Callable[[Any], None] | None = None

    def part(self) -> Part:
        return Part(self._receive, self._send)

    def alone(self) -> None:
        self._judge(lambda: live.claim(self.run_id, self.owner, self.pauses))

    def _send(self, pipe: Pipeline) -> None:
        self._read = live.queue_claim(pipe, self.run_id, self.owner, self.pauses)

    def _receive(self, replies: list[Any]) -> None:
        read = self._read
        assert read is not None
        self._judge(lambda: read(replies[0]))

    def _judge(self, claim: Callable[[], None]) -> None:
        try:
            claim()
            self.taken = True
        except live.Held as exc:
            self.held = exc
        except IllegalTransition as exc:
            self.refused = exc
        except Exception as exc:
            self.failed = exc

    def give_back(self) -> None:
        if self.taken:
            _give_back_claim(self.run_id, self.owner)


def _claim_unread(
    definition: TaskDefinition, claim: _LiveClaim, carried: Carried | None
) -> ClaimedRun | _Refusal:
    """A first delivery's claim: Valkey's (judged here), then Postgres's; a plain run whose
    message carries its input reads nothing. A refusal leaves both stores as they were and
    sends the message to the paths that read the row."""
    if claim.failed is not None:
        raise claim.failed
    if claim.held is not None:
        # Pending in both stores, its message acknowledged: a resume publishes it again.
        log.info("%s; parked", claim.held)
        return _Refusal.HANDLED
    if claim.refused is not None:
        log.debug("run %s: live claim refused (%s)", claim.run_id, claim.refused.current)
        return _Refusal.READ_ROW
    if definition.pipeline or definition.while_active is WhileActive.FOLLOW_UP:
        claimed = _claim_durable(definition, claim.run_id, claim.owner)
    elif carried is not None:
        # Only its start's message carries the row, and only its first delivery gets here
        # (a redelivery reads the row): the run is pending at its first attempt, or Postgres
        # has moved it since (a cancel), which the end's guard refuses (`durable.end`).
        return ClaimedRun(
            claim.run_id,
            carried["input"],
            carried["identity"],
            carried["priority"],
            attempts=1,
            stages={},
            results={},
            deferred_since=timezone.now(),
        )
    else:
        claimed = _read_claimable(claim.run_id, claim.owner)
    if claimed is _Refusal.READ_ROW:
        _give_back_claim(claim.run_id, claim.owner)
    return claimed


def _read_claimable(run_id: str, owner: str) -> ClaimedRun | _Refusal:
    """A plain run's Postgres half of its claim, read and not written: the end (or the watch,
    for a run still going) writes it. A run Postgres does not call pending and due goes to
    the paths that read the row, which say why (a cancel before pickup ends it there)."""
    try:
        claimed = durable.read_claimable(run_id, since=timezone.now())
    except Exception:
        _give_back_claim(run_id, owner)  # as for a claim Postgres did not take
        raise
    return _Refusal.READ_ROW if claimed is None else claimed


def _claim(definition: TaskDefinition, row: TaskHistory, owner: str) -> ClaimedRun | None:
    """pending → active in Valkey, then Postgres, for a run whose row says pending. None when
    the run is not ours to run, or not yet (its message published again for later)."""
    try:
        live.claim(row.id, owner, live.Pauses.of(definition.id, definition.resource_class))
    except live.Held as held:
        log.info("%s; parked", held)
        return None
    except live.Settling as settling:
        # Seeded again after Valkey lost its hash: a handler that held the lost claim takes it
        # back meanwhile (`runs.watch`); this message comes back once the mark has run out.
        republish(definition, row.id, row.identity, row.priority, settling.left)
        return None
    except IllegalTransition as exc:
        if exc.current is None:
            # The live hash is gone (Valkey restarted or flushed). A handler may still run the
            # run on a claim Postgres has not heard of yet (a plain run's first second): seeded
            # again and marked, the run is claimed only by that handler until the mark runs
            # out (`live.reseed`); this message comes back then. Claimed now, it could run
            # beside that handler.
            live.reseed(row.id, row.task_id, row.priority, tuple(row.stages))
            settle = timedelta(seconds=live.reseed_settle_s())
            log.warning("run %s: live hash was missing; seeded again, back in %s", row.id, settle)
            republish(definition, row.id, row.identity, row.priority, settle)
            return None
        if exc.current == RunState.ACTIVE and redelivery.write_abandoned_claim(row.id):
            # Its claimer is gone: the claim is in Postgres now, and the run is a lost
            # worker's, put back or failed by its task's policy like any other.
            row.refresh_from_db()
            redelivery.not_pending(definition, row)
            return None
        else:
            log.info("run %s: not claimed, live state is %s", row.id, exc.current)
            return None
    claimed = _claim_durable(definition, row.id, owner)
    return claimed if isinstance(claimed, ClaimedRun) else None


def _claim_durable(definition: TaskDefinition, run_id: str, owner: str) -> ClaimedRun | _Refusal:
    """Postgres pending → active, after the Valkey claim succeeded."""
    try:
        claimed = durable.claim(run_id, owner)
    except Exception:
        # Postgres did not take the claim (its connection dropped, Postgres away): the Valkey
        # claim goes back to pending, or every later delivery would find the run claimed by
        # this process and refuse it while Postgres still says pending (found by the fault
        # battery, tests/faults). The message is acknowledged as failed; the reconciler
        # publishes the pending run again.
        _give_back_claim(run_id, owner)
        raise
    if claimed is not None:
        return claimed
    # Postgres moved on (e.g. cancelled) or the run is not due yet; Postgres wins.
    current = durable.state_of(run_id)
    log.info("run %s: claim lost to Postgres state %s", run_id, current)
    if current == RunState.CANCELLING:
        terminal.cancel(definition, run_id, owner)
        return _Refusal.HANDLED
    return _Refusal.READ_ROW


def _give_back_claim(run_id: str, owner: str) -> None:
    try:
        live.transition(run_id, RunState.PENDING, owner=owner)
    except Exception:
        log.exception("run %s: Postgres refused the claim and Valkey kept it", run_id)


@contextmanager
def task_connections() -> Iterator[None]:
    """Around a task's body: its connections checked before (`check_connections`), and closed
    after when broken or too old; Celery's Django fix-up leaves both to the task."""
    check_connections()
    try:
        yield
    finally:
        close_old_connections()


def check_connections() -> None:
    """Before a run: close this thread's connections that are broken or past their age, without
    a round trip where Django's health check (CONN_HEALTH_CHECKS) would send `SELECT 1`.

    Celery's Django fix-up starts every task as a new "request", so the health check cost a
    no-op run one Postgres round trip in four (issue 9). An idle connection has nothing to read
    unless its server ended it (a terminated backend, a restart, an idle timeout: Postgres
    writes its FATAL and closes), so a readable socket gives the same verdict for the price of
    a poll. A connection cut without a word (a dead network path) is found by the run's first
    statement instead: the claim fails, its Valkey half is given back and the message is
    retried or re-published, as for any claim Postgres did not take.
    """
    for conn in connections.all(initialized_only=True):
        conn.close_if_unusable_or_obsolete()  # age, autocommit left off, errors seen
        raw = conn.connection
        if raw is None:
            continue
        poller = select.poll()
        poller.register(raw.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        if poller.poll(0):
            conn.close()
        else:
            # What Django's own check sets once it passed (not in django-stubs).
            conn.health_check_done = True  # type: ignore[attr-defined]
