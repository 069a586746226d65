"""Pause and resume a task or a whole resource class, cluster-wide (issue 27).

Postgres holds the pauses (`task_pause`, one row in force per scope and name); the runs read
their Valkey mirror (the admission and claim scripts, and `hooks.pause` for stages and refused
starts): a paused run is parked at pickup: it stays `pending`, its message acknowledged unrun.

- `pause`: the row is inserted, then mirrored. A second pause of the same scope and name is
  refused (`AlreadyPaused`); a mirror that cannot be written takes the row back out and the
  error is raised, so a pause the caller was told failed holds nothing.
- `resume`: the row is ended (`resumed_at`, `resumed_by`), the mirror cleared, then the runs the
  pause held are published again, most urgent first (priority, then creation), through
  `runs.publish`: every pending run of the scope's tasks whose message is not waiting in a
  queue, unless another pause still in force holds it (a task inside a resumed class). Then,
  once the processes' copies of the mirror have expired (`hooks.pause.STAGE_FRESH_S`), the
  stages it held: the due stages of the pipeline runs under way whose messages are in no
  queue and held by no worker (`runs.pipeline.advance_stalled`, as `recovery.stages` does). If the
  mirror cannot be cleared the error is raised; the resume stands (Postgres says so), the
  leader's `windows` loop rebuilds the mirror within a second (`recovery.windows`) and the
  reconciler's pending check publishes the runs.
- For the reconciler (`Holds`): held runs are neither published again nor failed at
  LUMASTRA_PENDING_DEADLINE_S, and a run released by a resume counts its wait from the resume,
  so a long pause does not fail its runs the moment it ends; held stages are not published
  again by `recovery.stages`.
- `mirror_truth`: what the mirror should say, the pauses in force and the closed run windows;
  the leader's `windows` loop makes it say so every second (`recovery.windows.tick`).

Not guaranteed:
- A resume publishes its runs one by one in the caller's request (about a broker write each):
  a pause that held many thousands of runs makes a slow resume.
- A resume whose scope has pipeline stages answers a second later (STAGE_FRESH_S).
- A resumed run's wait counts from the resume only within one pending deadline of it: a run
  of a scope paused, resumed, and still not taken a deadline later is failed as any other.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.utils import timezone

from orchestrator import windows
from orchestrator.hooks import dispatch as hooks
from orchestrator.hooks import pause as gate
from orchestrator.hooks.base import Republished
from orchestrator.models import PauseScope, TaskHistory, TaskPause
from orchestrator.recovery.orphans import Candidate
from orchestrator.recovery.pending import held_by_workers, in_broker_lists
from orchestrator.routing import queue_name, stage_class, stage_queue
from orchestrator.runs import pipeline
from orchestrator.runs.publish import (
    Outgoing,
    republish,
    seed_and_publish_many,
    stage_message_id,
)
from orchestrator.states import RunState
from orchestrator.stores import keys, live, queries
from orchestrator.stores.broker import job_id
from orchestrator.stores.durable import Stages, json_value
from tasks import registry
from tasks.definition import TaskDefinition
from tasks.resources import RESOURCE_CLASSES

log = logging.getLogger(__name__)


class UnknownScope(LookupError):
    """No task, or no resource class, of that name."""


class AlreadyPaused(Exception):
    code = "already_paused"


class NotPaused(Exception):
    code = "not_paused"


@dataclass(frozen=True)
class Resumed:
    pause: TaskPause
    released: int  # runs and stages published again


def tasks_of(scope: PauseScope, name: str) -> list[TaskDefinition]:
    """The tasks a pause of `scope` and `name` holds; `UnknownScope` when nothing has that name."""
    found = registry.get()
    if scope == PauseScope.TASK:
        if name not in found:
            raise UnknownScope(f"unknown task {name!r}")
        return [found[name]]
    if name not in RESOURCE_CLASSES:
        raise UnknownScope(f"unknown resource class {name!r}; known: {sorted(RESOURCE_CLASSES)}")
    return [found[task_id] for task_id in sorted(found) if found[task_id].resource_class == name]


def in_force() -> list[TaskPause]:
    return list(TaskPause.objects.filter(resumed_at__isnull=True).order_by("scope", "name"))


def _mode(row: TaskPause) -> str:
    return gate.REFUSE if row.refuse_starts else gate.HOLD


def pause(
    scope: PauseScope, name: str, *, by: str, reason: str = "", refuse_starts: bool = False
) -> TaskPause:
    tasks_of(scope, name)
    try:
        with transaction.atomic():
            row = TaskPause.objects.create(
                scope=scope, name=name, paused_by=by, reason=reason, refuse_starts=refuse_starts
            )
    except IntegrityError:
        raise AlreadyPaused(f"{scope} {name!r} is already paused") from None
    try:
        gate.mirror(keys.pause_field(scope, name), _mode(row))
    except Exception:
        TaskPause.objects.filter(pk=row.pk).delete()
        raise
    row.refresh_from_db()
    log.warning("%s %s paused by %s (%s): %s", scope, name, by, _mode(row), reason)
    return row


def resume(scope: PauseScope, name: str, *, by: str) -> Resumed:
    definitions = tasks_of(scope, name)
    with transaction.atomic():
        row = (
            TaskPause.objects.select_for_update()
            .filter(scope=scope, name=name, resumed_at__isnull=True)
            .first()
        )
        if row is None:
            raise NotPaused(f"{scope} {name!r} is not paused")
        TaskPause.objects.filter(pk=row.pk).update(resumed_at=Now(), resumed_by=by)
    row.refresh_from_db()
    field = keys.pause_field(scope, name)
    # A resume inside the scope's closed run window leaves the window holding its runs (all
    # but an operator's, which the release publishes).
    closed = field in windows.Now.at(timezone.now()).closed()
    gate.mirror(field, live.WINDOW if closed else None)
    released = release_scope(scope, name, definitions)
    log.warning("%s %s resumed by %s: %s runs published again", scope, name, by, released)
    return Resumed(row, released)


def release_scope(
    scope: PauseScope,
    name: str,
    definitions: Sequence[TaskDefinition],
    at: datetime | None = None,
) -> int:
    """Publish what a pause or a closed window of `scope` and `name` held, and nothing else
    holds at `at` (default: now): its runs, then, once the processes' copies of the mirror
    have expired, its pipelines' stages."""
    released = release(definitions, at)
    pipelines = [d for d in registry.get().values() if _holds_stages_of(d, scope, name)]
    if pipelines:
        time.sleep(gate.STAGE_FRESH_S)
        released += release_stages(pipelines, at)
    return released


def mirror_truth(closed: Iterable[str]) -> dict[str, str]:
    """What the pauses' mirror should say: each pause in force (`task_pause`) its mode, each
    other field of a `closed` run window WINDOW."""
    truth = dict.fromkeys(closed, live.WINDOW)
    truth.update({keys.pause_field(row.scope, row.name): _mode(row) for row in in_force()})
    return truth


def release(definitions: Sequence[TaskDefinition], at: datetime | None = None) -> int:
    """Publish the parked runs of `definitions` that no pause or closed window holds at `at`
    (default: now), most urgent first; a run whose message waits in a queue is left there."""
    holds = Holds.load(0, at)
    # A window holds every run but an operator's: a task it holds may still have some to send.
    free = {d.id: d for d in definitions if not holds.holds(d.id, live.OPERATOR_PRIORITY)}
    if not free:
        return 0
    rows = (
        TaskHistory.objects.filter(task_id__in=list(free), state=RunState.PENDING)
        # A delayed start not due yet is the due loop's to publish (`runs.due`).
        .exclude(attempts=0, not_before__gt=timezone.now())
        .order_by("priority", "created_at", "id")
        .values_list("id", "task_id", "identity", "priority", "not_before", "processing_version")
    )
    per_task = settings.CONFIG.per_task_queues
    waiting = in_broker_lists({queue_name(d, per_task) for d in free.values()})
    now_runs, later = [], []
    for run_id, task_id, identity, priority, not_before, version in rows.iterator():
        if run_id in waiting or holds.holds(task_id, priority):
            continue
        definition = free[task_id]
        hooks.republished(Republished(definition, run_id, identity))
        if not_before is not None and not_before > timezone.now():
            later.append((definition, run_id, identity, priority, not_before))
        else:
            job = job_id(task_id, identity, run_id)
            now_runs.append(Outgoing(definition, run_id, job, priority, processing_version=version))
    # A pause longer than a live hash's TTL outlived the runs' hashes: seeded again (a no-op
    # for a hash still there) before their messages.
    seed_and_publish_many(now_runs)
    live.seed_many(
        [live.Seed(run, d.id, priority, d.stage_order) for d, run, _, priority, _ in later]
    )
    for definition, run_id, identity, priority, not_before in later:
        republish(definition, run_id, identity, priority, not_before - timezone.now())
    return len(now_runs) + len(later)


def _holds_stages_of(definition: TaskDefinition, scope: PauseScope, name: str) -> bool:
    if scope == PauseScope.TASK:
        return definition.id == name and bool(definition.pipeline)
    return any(stage_class(definition, stage) == name for stage in definition.pipeline)


def release_stages(definitions: Sequence[TaskDefinition], at: datetime | None = None) -> int:
    """Publish the held stages of `definitions`' pipeline runs under way that no pause in force
    or closed window holds at `at`, the most urgent run first."""
    by_id = {d.id: d for d in definitions}
    with connection.cursor() as cursor:
        cursor.execute(queries.HELD_PIPELINES, {"task_ids": list(by_id)})
        rows = cursor.fetchall()
    if not rows:
        return 0
    per_task = settings.CONFIG.per_task_queues
    queues = {stage_queue(d, stage, per_task) for d in definitions for stage in d.pipeline}
    present = in_broker_lists(queues) | held_by_workers()
    present |= Holds.load(0, at).held_stages(rows)
    released = 0
    for run_id, task_id, input_, owner, identity, priority, states, results in rows:
        stages = Stages(json_value(states), json_value(results))
        released += pipeline.advance_stalled(
            by_id[task_id], run_id, json_value(input_), owner, identity, priority, stages, present
        )
    return released


@dataclass(frozen=True)
class Holds:
    """The pauses and closed run windows as the reconciler's pending check needs them: the
    fields that hold, and the seconds since each recent resume (by the Postgres clock) or
    window opening."""

    paused: frozenset[str]  # the fields of the pauses in force
    resumed_s: dict[str, float]
    windowed: frozenset[str] = frozenset()  # the fields of the closed windows no pause holds

    @classmethod
    def load(cls, within_s: int, at: datetime | None = None) -> Holds:
        since = ExpressionWrapper(Now() - F("resumed_at"), output_field=DurationField())
        rows = TaskPause.objects.filter(
            Q(resumed_at__isnull=True) | Q(resumed_at__gt=Now() - timedelta(seconds=within_s))
        ).annotate(since=since)
        paused: set[str] = set()
        resumed: dict[str, float] = {}
        for row in rows.values_list("scope", "name", "since"):
            field = keys.pause_field(row[0], row[1])
            if row[2] is None:
                paused.add(field)
            else:
                seconds = row[2].total_seconds()
                resumed[field] = min(seconds, resumed.get(field, seconds))
        now = timezone.now() if at is None else at
        current = windows.Now.at(now)
        closed = set(current.closed())
        for field, seconds in current.opened_s(now).items():
            if seconds <= within_s:
                resumed[field] = min(seconds, resumed.get(field, seconds))
        return cls(frozenset(paused), resumed, frozenset(closed - paused))

    def _fields(self, task_id: str) -> tuple[str, ...]:
        definition = registry.get().get(task_id)
        if definition is None:
            return (keys.pause_field(PauseScope.TASK, task_id),)
        return gate.fields_of(definition)

    def _mode(self, field: str) -> str | None:
        if field in self.paused:
            return gate.HOLD
        return live.WINDOW if field in self.windowed else None

    def holds(self, task_id: str, priority: int) -> bool:
        """Whether a run of `task_id` at `priority` is held, by the claim's own rule
        (`live.holds`: a window lets an operator's run pass)."""
        return any(live.holds(self._mode(f), priority) for f in self._fields(task_id))

    def held_by(self, task_id: str) -> str | None:
        """ "pause" when a pause holds the task's runs, else "window" when a closed run window
        holds them (all but an operator's), else None."""
        modes = {self._mode(f) for f in self._fields(task_id)} - {None}
        return None if not modes else "window" if modes == {live.WINDOW} else "pause"

    def held_stages(self, rows: Sequence[Sequence[Any]]) -> set[str]:
        """The message ids of the stages a pause or a closed window holds among pipeline
        `rows` (run id, task id first): none of them is to be published while held."""
        held: set[str] = set()
        if not self.paused and not self.windowed:
            return held
        found = registry.get()
        for run_id, task_id, *_ in rows:
            definition = found.get(task_id)
            if definition is None:
                continue
            for stage in definition.pipeline:
                fields = gate.fields_for(task_id, stage_class(definition, stage))
                if any(self._mode(field) for field in fields):
                    held.add(stage_message_id(run_id, stage.name))
        return held

    def sort(self, pending: Sequence[Candidate]) -> tuple[list[Candidate], int]:
        """(the candidates the pending check judges, how many pauses hold); a run released by
        a recent resume has waited only since it."""
        judged: list[Candidate] = []
        held = 0
        for candidate in pending:
            fields = self._fields(candidate.task_id)
            if self.holds(candidate.task_id, candidate.priority):
                held += 1
                continue
            since = [self.resumed_s[f] for f in fields if f in self.resumed_s]
            if since and min(since) < candidate.age_s:
                candidate = dataclasses.replace(candidate, age_s=min(since))
            judged.append(candidate)
        return judged, held
