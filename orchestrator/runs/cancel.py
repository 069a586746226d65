"""Cancelling runs: an operator's request, and backpressure shedding waiting runs.

A run not yet picked up ends at once: Postgres pending → cancelling → cancelled, its queued
message removed if it still waits (if a worker already reserved it, the claim refuses it). A
run Postgres calls pending while Valkey names the worker running it (its claim not written
yet) has that claim written first, and is cancelled as a running run. A cancel that races the
pickup itself (read before the worker's Valkey claim, written after its read of the row) may
still end the run as not started: its handler is stopped within about a second, when its
watch finds the run gone (`runs.watch`).
A running run goes to `cancelling` in both stores and its handler is told: "cancel <runId>" on
the cancel channel of the process that owns it (`<ns>:task:cancel:<owner>`, the live hash's
`owner`, which every worker process's run watch listens on for its whole life: no channel per
run), sent by the same script that marks the hash, so a claim cannot slip between the two. A
pipeline's running stages may run in other processes (a stage runs wherever its message was
taken, under the run's watch): each stage's claimer (its step record's `owner` in Postgres) is
told too. The watch trips the context's flag when the message names the run it watches;
`raise_if_cancelled()` and `ctx.sleep()` stop the handler. A cancel no watch heard (asked
before the run's watch began, or while Valkey was away) is still seen: the context reads the
hash at most once a second while the handler checks, and each heartbeat reads `cancelling`.
A handler that does not stop within LUMASTRA_CANCEL_ESCALATE_S is ended by its watch thread
(Postgres `cancelled` first, then its process is killed); if its worker is already dead, the
reconciler ends it when the heartbeat goes stale. An operator may skip the cooperative wait
(`kill=True`, "kill now"): "kill <runId>" on the same channels, and the watch ends the run and
kills its process as soon as it hears, as the escalation would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.db import connection

from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs import catch_up, pipeline, retries, terminal
from orchestrator.runs.shed import signal
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import broker, durable, keys, live, queries, valkey
from tasks import registry
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

# What a cancel may be asked of; kill now also of a run already cancelling (its handler is not
# waited for).
CANCELLABLE = (RunState.PENDING, RunState.ACTIVE)
KILLABLE = (*CANCELLABLE, RunState.CANCELLING)


class UnknownRun(LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}")


class NotCancellable(ValueError):
    def __init__(self, run_id: str, state: str | None) -> None:
        super().__init__(f"run {run_id} has already ended ({state}); nothing to cancel")
        self.state = state


def request_cancel(run_id: str, *, actor: str, kill: bool = False) -> RunState:
    """Ask a run to stop; returns its state afterwards (cancelled or cancelling). With `kill`,
    a running handler is not waited for: its watch ends the run and kills its process at once
    (also for a run already cancelling). Its live descendants (`ctx.spawn`) are asked after it
    (`cancel_descendants`)."""
    state = _request_cancel(run_id, actor=actor, kill=kill)
    cancel_descendants(run_id, f"{actor}, with its ancestor {run_id}", kill=kill)
    return state


def cancel_descendants(run_id: str, actor: str, *, kill: bool = False) -> int:
    """Cancel every live run spawned under `run_id`, at any depth (one recursive query), each
    as an ordinary cancel but for its queued message, left for its claim to refuse (a message
    taken out one at a time would read a long queue once per child). A child that ended
    meanwhile, or whose cancel fails, is skipped: the reconciler's `children` chore cancels
    the live children of an ended parent later. Returns how many were asked."""
    with connection.cursor() as cursor:
        cursor.execute(queries.LIVE_DESCENDANTS, {"run_id": run_id})
        found = [child_id for (child_id,) in cursor.fetchall()]
    asked = 0
    for child_id in found:
        try:
            _request_cancel(child_id, actor=actor, kill=kill, take_message=False)
            asked += 1
        except NotCancellable:
            pass  # it ended meanwhile
        except Exception:
            log.exception("run %s: the cancel of its descendant %s failed", run_id, child_id)
    return asked


def _request_cancel(run_id: str, *, actor: str, kill: bool, take_message: bool = True) -> RunState:
    row = TaskHistory.objects.filter(id=run_id).values_list("task_id", "state").first()
    if row is None:
        raise UnknownRun(run_id)
    definition = registry.get()[row[0]]
    if row[1] == RunState.PENDING:
        # A worker may be running it before Postgres heard of its claim (a short run's claim is
        # folded into its end, `runs.runner`): the claim is written for it, so the cancel
        # reaches its handler instead of ending the run under it.
        catch_up.write_live_claim(run_id)
    try:
        was_pending = durable.request_cancel(run_id) == RunState.PENDING
    except IllegalTransition as exc:
        if exc.current == RunState.CANCELLING:
            if kill:
                _kill_now(run_id)
            return RunState.CANCELLING
        raise NotCancellable(run_id, exc.current) from None
    signal(run_id, actor)
    error = retries.error_doc(ErrorKind.CANCELLED, f"cancelled by {actor}")
    if not was_pending:
        state = None
        if definition.pipeline:
            # Its stages can no longer be claimed (a claim needs the run active): the running
            # ones are all the claimers there will be.
            tell(_claimers(run_id)[1], keys.cancel_message(run_id))
            state = pipeline.discard(definition, run_id, error)
        if kill and state != RunState.CANCELLED:
            _kill_now(run_id)
        return state or RunState.CANCELLING
    if take_message:
        broker.remove_waiting(queue_name(definition, settings.CONFIG.per_task_queues), run_id)
    terminal.cancel(definition, run_id, error=error)
    return RunState.CANCELLED


def _kill_now(run_id: str) -> None:
    # After the cancel itself, on the same channels: the watch has tripped the handler's flag
    # (or will, from its heartbeat) and now stops waiting for it.
    # Its owner as Valkey and as Postgres name it (the same process but while one of them
    # lost it), and its running stages' claimers.
    owner, stages = _claimers(run_id)
    owners = {str(live.read(run_id).get("owner") or ""), owner, *stages}
    if not tell(owners, keys.cancel_message(run_id, kill=True)):
        log.info("run %s: kill requested but no watch listens; the reconciler will end it", run_id)


def _claimers(run_id: str) -> tuple[str, set[str]]:
    """The run's owner as Postgres names it, and the processes running its pipeline stages
    now (each running stage's step record names its claimer): a stage runs under the run's
    watch, but in whichever process took its message, which may not be the run's owner."""
    found = (
        TaskHistory.objects.filter(id=run_id)
        .values_list("owner_instance_id", "stages", "steps")
        .first()
    )
    if found is None:
        return "", set()
    owner, stages, records = found[0] or "", found[1] or {}, found[2] or {}
    running = {
        str(records.get(name, {}).get("owner") or "")
        for name, state in stages.items()
        if state == StageState.ACTIVE.value
    }
    return owner, running - {""}


def tell(owners: Iterable[str], message: str) -> int:
    """`message` on each owner's cancel channel; how many watches heard it."""
    channels = sorted(keys.cancel_channel(owner) for owner in set(owners) - {""})
    if not channels:
        return 0
    pipe = valkey.client().pipeline(transaction=False)
    for channel in channels:
        pipe.publish(channel, message)
    return sum(int(heard) for heard in valkey.execute(pipe))
