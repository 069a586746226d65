"""Run windows opening and closing (issue 38): the leader's `windows` loop, which also keeps
the pauses' Valkey mirror true, and an operator's window set or removed. What a window is and
holds: `orchestrator.windows`; a pause: `recovery.pauses`.

A tick (every `windows.TICK_S` on the cluster leader, `orchestrator.loops`; at once after an
operator's change):
1. reads the windows in force (one query) and computes which are closed now, by the clock it
   is given;
2. makes the pauses' Valkey mirror say so, beside the pauses in force (`recovery.pauses.
   mirror_truth`; the whole hash written again under a WATCH, so a pause or resume written
   meanwhile wins and the next tick tries again). A mirror Valkey lost, or a pause whose resume
   could not clear it, is put right here too, and logged;
3. for each window that opened since the mirror last said so (noted in `keys.window_releases`
   in the same MULTI that clears its field, so a release that fails or a leader that dies
   mid-way leaves it to the next tick): publishes the runs it held, most urgent first, then
   oldest (`recovery.pauses.release_scope`, as a resume does); runs another closed window or a
   pause still holds stay held;
4. asks the running runs of each closed window with `on_close="stop"` to stop (every tick, so a
   run claimed just before is asked too): "stop <runId>" on its owner's cancel channel, which
   its watch turns into the handler's cancel flag (`ctx.raise_if_cancelled`, `ctx.sleep`); the
   handler's RunCancelled then puts the run back to `pending` as the same run, its attempt
   given back (`runs.execute`, error kind `window_closed`), and the closed window parks its
   message. A handler that does not check finishes; an operator's run (priority 1) and a
   pipeline's stages are not asked.

Nothing is lost when no leader ticks: held runs are `pending` rows that stay so; a window that
opened meanwhile is seen by the next tick, which releases them then. The reconciler's pending
check leaves held runs alone, and counts a released run's wait from its window's opening.

Not guaranteed:
- A window opens and closes for runs within TICK_S of its edge while a leader runs (within the
  leader's failover otherwise); a pickup in that second finds the mirror as it was.
- Valkey keeps no memory of a window that opened while it had lost the mirror: the runs that
  window held are published by the reconciler's pending check (their messages are gone), not
  by the opening.
- An operator's window that is never open together with the other window its runs need (a
  task's and its class's) is refused (`windows.check_overlap`, over the next eight days); the
  code's and the environment's are not checked against each other.
- During a rolling deploy from a version before issue 38, its reconcilers rebuild the mirror
  from the pauses alone every 30 s and so clear closed windows' fields until they are gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast
from zoneinfo import ZoneInfo

from django.db import DatabaseError, transaction
from django.utils import timezone
from redis.client import Pipeline

from orchestrator import windows
from orchestrator.clock import SYSTEM, Clock
from orchestrator.cluster.locks import Fence
from orchestrator.hooks import keyed, limits
from orchestrator.hooks import pause as gate
from orchestrator.models import NotificationKind, PauseScope, RunWindow, TaskHistory
from orchestrator.notifications import events
from orchestrator.recovery import pauses
from orchestrator.runs import cancel, coalesce
from orchestrator.states import RunState
from orchestrator.stores import keys, live, valkey
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.window import Window

log = logging.getLogger(__name__)

HELD_COUNTED = 10_000
# A window that was open this long ago and is closed now has just closed (a leader's failover
# takes less).
CLOSING_SEEN_WITHIN = timedelta(minutes=1)


def tick(fence: Fence | None = None, clock: Clock = SYSTEM) -> int:
    """One tick; returns how many held runs and stages it published."""
    if fence is not None:
        fence.check()
    now = clock.now()
    current = windows.Now.at(now)
    closed = current.closed()
    truth: dict[str, str] = {}

    def read_truth() -> dict[str, str]:  # called under the WATCH; kept for the log below
        truth.update(pauses.mirror_truth(closed))
        return truth

    def note_openings(pipe: Pipeline, before: Mapping[str, str]) -> None:
        opened = [f for f, mode in before.items() if mode == live.WINDOW and f not in closed]
        if opened:
            pipe.sadd(keys.window_releases(), *opened)

    before = gate.rebuild(read_truth, note_openings)
    if before is not None:
        if _pauses_of(before) != _pauses_of(truth):
            log.warning("the pauses' Valkey mirror differed from task_pause; rebuilt")
        if newly := closed.keys() - before.keys():
            # A window set while closed, or a mirror Valkey lost, is no closing: only one that
            # was open a little while ago closed.
            was_closed = windows.Now.at(now - CLOSING_SEEN_WITHIN).closed()
            for field in newly:
                log.info("window of %s closed", field.replace(":", " ", 1))
                if field not in was_closed:
                    _notify_if_held(field)
    released = _release_opened(closed, now, fence)
    try:
        _stop_running(current.stopping())
    except Exception:
        log.exception("windows: running runs not asked to stop; the next tick asks again")
    return released


def _release_opened(closed: Mapping[str, object], now: datetime, fence: Fence | None) -> int:
    """Publish what each opened window held (`keys.window_releases`), most urgent first; a
    window closed again meanwhile has nothing to publish, one that fails is tried next tick."""
    client = valkey.client()
    opened = sorted(cast(set[str], client.smembers(keys.window_releases())))
    released = 0
    for field in opened:
        if fence is not None:
            fence.check()
        scope, _, name = field.partition(":")
        try:
            if field not in closed:
                definitions = pauses.tasks_of(PauseScope(scope), name)
                count = pauses.release_scope(PauseScope(scope), name, definitions, at=now)
                log.info("window of %s %s opened: %d held runs published", scope, name, count)
                released += count
        except pauses.UnknownScope:
            pass  # not registered here: its runs wait for the pending check
        except Exception:
            log.exception("window of %s %s opened; its release is tried again", scope, name)
            continue
        client.srem(keys.window_releases(), field)
    return released


def _notify_if_held(field: str) -> None:
    """A window that closes on runs still waiting for it (more work than fit) is an operator's
    notification; counted up to HELD_COUNTED, at the closing edge only."""
    scope, _, name = field.partition(":")
    try:
        task_ids = [d.id for d in pauses.tasks_of(PauseScope(scope), name)]
        held = TaskHistory.objects.filter(state=RunState.PENDING, task_id__in=task_ids)[
            :HELD_COUNTED
        ].count()
        if held:
            many = f"{held}+" if held == HELD_COUNTED else str(held)
            events.notify(
                NotificationKind.WINDOW_HELD,
                subject=field,
                title=f"Run window of {scope} {name} closed with {many} runs waiting",
                body=(
                    f"The run window of {scope} {name} closed before its work was done: "
                    f"{many} runs wait for it to open again."
                ),
                link="/admin/orchestrator/taskhistory/tasks/",
            )
    except pauses.UnknownScope:
        pass  # not registered here: another version's window
    except DatabaseError:
        # The mirror's change stands; the operator misses this one notification.
        log.exception("window of %s closed; its notification was not recorded", field)


def _pauses_of(mirror: Mapping[str, str]) -> dict[str, str]:
    return {field: mode for field, mode in mirror.items() if mode != live.WINDOW}


def _stop_running(stopping: Mapping[str, windows.Scoped]) -> None:
    """Ask the running runs of the closed windows that stop them to stop, every tick: a run
    whose claim Postgres heard of after the last tick, or whose watch missed the message, is
    asked again. Not an operator's run (priority 1), nor a pipeline's (its stages finish)."""
    task_ids: set[str] = set()
    for scoped in stopping.values():
        try:
            found = pauses.tasks_of(scoped.scope, scoped.name)
        except pauses.UnknownScope:
            continue
        task_ids.update(d.id for d in found if not d.pipeline)
    if not task_ids:
        return
    running = (
        TaskHistory.objects.filter(state=RunState.ACTIVE, task_id__in=task_ids)
        .exclude(priority=live.OPERATOR_PRIORITY)
        .values_list("id", "owner_instance_id")
    )
    for run_id, owner in running:
        if cancel.tell([owner], keys.cancel_message(run_id, stop=True)):
            log.info("run %s: asked to stop, its run window closed", run_id)


def set_window(scope: PauseScope, name: str, window: Window, *, by: str) -> windows.Scoped:
    """The operator's window for a scope, in place of the code's or the environment's; in
    force on every host at once (this process ticks), and on the leader's next tick anyway.
    WindowError when its runs could never start: never open together with the window of its
    class (a task's), or of one of its tasks (a class's)."""
    pauses.tasks_of(scope, name)  # UnknownScope for no such task or class
    scoped = windows.Scoped(scope, name, window, windows.Source.OPERATOR, by)
    windows.check_overlap(scoped, timezone.now())
    with transaction.atomic():
        RunWindow.objects.update_or_create(
            scope=scope,
            name=name,
            defaults={
                "span": window.span,
                "days": window.days,
                "tz": window.tz or "",
                "on_close": str(window.on_close),
                "actor": by,
            },
        )
    log.warning("%s %s: run window %s set by %s", scope, name, window.describe(), by)
    _apply_now()
    return windows.of(scope, name) or scoped


def remove_window(scope: PauseScope, name: str, *, by: str) -> bool:
    """Drop the operator's window of a scope (the code's or the environment's, if any, is in
    force again); False when it had none."""
    pauses.tasks_of(scope, name)
    deleted, _ = RunWindow.objects.filter(scope=scope, name=name).delete()
    if deleted:
        log.warning("%s %s: the operator's run window removed by %s", scope, name, by)
        _apply_now()
    return bool(deleted)


def _apply_now() -> None:
    """An operator's change in force at once; if this tick fails, the leader's next one
    applies it (the row is written)."""
    try:
        tick()
    except Exception:
        log.exception("windows: a tick after an operator's change failed; the leader's applies it")


@dataclass(frozen=True)
class Hold:
    """What holds a pending run: a pause or a closed window, of its task or its class, the
    debounce of its task, the running run it follows up (scope "run", named), or its key's
    turn under keyed concurrency (scope "key", named), or named limits that had no room
    (scope "limit", their ids)."""

    by: str  # "pause", "window", "debounce", "follow_up", "concurrency" or "limit"
    scope: str
    name: str
    opens_at: datetime | None = None  # a window: when it opens; a debounce: when it is due
    tz: str | None = None  # the zone `opens_at` is told in

    def describe(self) -> str:
        if self.by == "follow_up":
            return f"follows up run {self.name}: starts when it ends"
        if self.by == "concurrency":
            return f"waits its turn: key {self.name!r} runs its limit"
        if self.by == "limit":
            return f"waits for limit {self.name}"
        if self.opens_at is None or self.tz is None:
            return f"held by the pause of {self.scope} {self.name}"
        local = self.opens_at.astimezone(ZoneInfo(self.tz))
        if self.by == "debounce":
            return f"debounced until {local:%H:%M:%S} {self.tz}"
        return f"waits for window (opens {local:%H:%M} {self.tz})"


def held(run: TaskHistory, at: datetime | None = None) -> Hold | None:
    """What holds a pending run now: a pause, else a closed window (an operator's run, priority
    1, passes it), else its debounce (`runs.coalesce`: its time moves with each start that
    joins it), else the running run it follows up, else its key's turn under keyed concurrency,
    else the named limits that had no room; None for any other run."""
    definition = registry.get().get(run.task_id)
    if definition is not None and (hold := _paused_or_windowed(definition, run.priority, at)):
        return hold
    if coalesce.MARK in run.trigger and run.not_before is not None:
        return Hold("debounce", "task", run.task_id, run.not_before, "UTC")
    if coalesce.WAITS_FOR in run.trigger:
        return Hold("follow_up", "run", str(run.trigger[coalesce.WAITS_FOR]))
    if definition is None:
        return None
    if definition.concurrency is not None:
        key = keyed.waiting_under(definition, run.id)
        if key is not None:
            return Hold("concurrency", "key", key)
    if definition.limits and (spent := limits.waiting_for(definition, run.id)):
        return Hold("limit", "limit", ", ".join(spent))
    return None


def _paused_or_windowed(
    definition: TaskDefinition, priority: int, at: datetime | None
) -> Hold | None:
    fields = gate.fields_of(definition)
    paused = {keys.pause_field(row.scope, row.name) for row in pauses.in_force()}
    for field in fields:
        if field in paused:
            scope, _, name = field.partition(":")
            return Hold("pause", scope, name)
    if not live.holds(live.WINDOW, priority):
        return None
    closed = windows.Now.at(timezone.now() if at is None else at).holding(fields)
    if closed is None:
        return None
    scoped, state = closed
    return Hold("window", scoped.scope, scoped.name, state.opens_at, scoped.tz)
