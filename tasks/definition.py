"""`define_task` and the immutable manifest it returns.

Every option is checked for shape here, at import time, so a bad definition fails startup with
a message naming the task and the field. Options whose behaviour arrives in later issues
(quotas, schedule, pipeline, backpressure, exclusive_with, covers_stages) are validated already.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum, IntEnum
from typing import Any

from pydantic import BaseModel

from tasks.context import TaskContext
from tasks.coverage import CoveredStage, normalised_stage, stage_problem
from tasks.errors import ManifestError
from tasks.pipeline import PipelineError, Stage, stage_order
from tasks.policies import (
    Concurrency,
    Debounce,
    Rate,
    Retry,
    Stall,
    StartPolicies,
    Throttle,
    Timeout,
    WhileActive,
)
from tasks.resources import RESOURCE_CLASSES, default_timeout
from tasks.retention import Retention, retention_problem
from tasks.schedule import Schedule, parse_schedule
from tasks.window import Window

# Longer identities are stored as a digest (see TaskDefinition.identity).
MAX_IDENTITY_LENGTH = 120
_TASK_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class Priority(IntEnum):
    """Lower is more urgent; the gaps leave room without renumbering."""

    OPERATOR = 1  # an operator's retry or explicit rush
    INTERACTIVE = 2  # a person is waiting (API, admin)
    EVENT = 3  # reacting to something that just happened
    SCHEDULED = 5  # periodic upkeep
    BACKGROUND = 7  # backfills and bulk work that can wait for everything else


class Backpressure(Enum):
    DROP = "drop"  # refuse quietly with a recorded "dropped" outcome
    FAIL_FAST = "fail-fast"  # refuse with an error the caller sees
    SHED_OLDEST = "shed-oldest"  # make room by cancelling the oldest, least urgent waiting runs


class Overlap(Enum):
    """What a schedule's fire does while the run of its previous fire is still live."""

    SKIP = "skip"  # start nothing: the slot is recorded as skipped, naming the live run
    QUEUE = "queue"  # start anyway; the task's own limits (max_concurrent) queue the runs
    ALLOW = "allow"  # start anyway, the runs side by side as far as the pools allow


@dataclass(frozen=True)
class Quotas:
    max_runs_per_day: int | None = None
    max_concurrent: int | None = None
    rate: str | None = None  # e.g. "60/m"
    # Daily caps on what the task spends, by cost kind (`ctx.spend`), e.g. {"openai_tokens": 2e6}.
    max_cost_per_day: Mapping[str, float] = field(default_factory=dict)
    # Whether `max_runs_per_day` is set: its day is counted exactly, in Postgres; else in Valkey
    # by the start's and the end's own scripts. Set once here, read on every start and end.
    capped: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "capped", self.max_runs_per_day is not None)

    def parsed_rate(self) -> Rate | None:
        return None if self.rate is None else Rate.parse(self.rate)


class NoInput(BaseModel, extra="forbid"):
    """The input model of a task that takes no input."""


Execute = Callable[[TaskContext, Any], object]
IdentityFor = Callable[[Any], str]


def _is_int(value: object) -> bool:
    # bool is an int subclass; True is not a version or a count.
    return isinstance(value, int) and not isinstance(value, bool)


def input_digest(data: dict[str, Any]) -> str:
    """A stable short digest of an input: the default identity of a run."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TaskDefinition:
    id: str
    resource_class: str
    # None for a pipeline task: its stages carry the bodies.
    execute: Execute | None
    input_model: type[BaseModel]
    identity_for: IdentityFor | None
    task_priority: Priority | None
    timeout: Timeout
    processing_version: int
    quotas: Quotas
    schedule: Schedule | None
    pipeline: tuple[Stage, ...]
    stage_order: tuple[str, ...]
    backpressure: Backpressure
    retry: Retry
    exclusive_with: tuple[str, ...]
    covers_stages: tuple[CoveredStage, ...]
    stall: Stall = field(default_factory=Stall)
    description: str = field(default="")
    # A schedule's fire while its previous fire's run is still live (`scheduler.fire`).
    overlap: Overlap = Overlap.SKIP
    # A run whose worker died mid-run (killed, lost, drained on shutdown) goes back to pending
    # for its next attempt while `retry.max_attempts` allows; False fails it instead, for work
    # that must never be repeated.
    retry_on_worker_loss: bool = True
    # The programs its handler runs (`ctx.run_process`): `lumastra.preflight` names the ones
    # missing on the machine.
    requires_commands: tuple[str, ...] = ()
    # The local hours its runs may start in (`tasks.window`); None: any time (its class's
    # window, if any, still holds it).
    window: Window | None = None
    # Starts of one identity that coalesce (`tasks.policies`, `orchestrator.runs.coalesce`).
    debounce: Debounce | None = None
    throttle: Throttle | None = None
    while_active: WhileActive = WhileActive.JOIN
    # Runs at once per key, keys taking turns (`orchestrator.hooks.keyed`).
    concurrency: Concurrency | None = None
    # The named limits (`tasks.limits.define_limit`) each run takes at pickup.
    limits: tuple[str, ...] = ()
    # How long its ended runs are kept (`tasks.retention`); None: the global retention.
    retention: Retention | None = None

    def stage(self, name: str) -> Stage:
        for stage in self.pipeline:
            if stage.name == name:
                return stage
        raise KeyError(f"task {self.id!r} has no stage {name!r}")

    def awaiting(self, name: str) -> list[str]:
        """The stages that await the children stage `name` spawns (`await_children`)."""
        return [s.name for s in self.pipeline if s.await_children and name in s.after]

    def identity(self, validated_input: BaseModel) -> str:
        """The run's identity. A long one (a deep path, say) is replaced by its digest so it
        fits the job id, the key and the column; equal identities still give equal digests."""
        if self.identity_for is None:
            return input_digest(validated_input.model_dump(mode="json"))
        identity = self.identity_for(validated_input)
        if not isinstance(identity, str) or not identity:
            raise TypeError(f"task {self.id!r}: identity_for must return a non-empty str")
        if len(identity) > MAX_IDENTITY_LENGTH:
            return "sha256:" + hashlib.sha256(identity.encode()).hexdigest()
        return identity


DEFAULT_RETRY = Retry()


def define_task(
    *,
    id: str,
    resource_class: str,
    execute: Execute | None = None,
    input_model: type[BaseModel] = NoInput,
    identity_for: IdentityFor | None = None,
    task_priority: Priority | int | None = None,
    timeout: Timeout | None = None,
    processing_version: int = 1,
    quotas: Quotas | None = None,
    schedule: str | Schedule | None = None,
    pipeline: Sequence[Stage] = (),
    backpressure: Backpressure | str = Backpressure.FAIL_FAST,
    retry: Retry = DEFAULT_RETRY,
    exclusive_with: Sequence[str] = (),
    covers_stages: Sequence[CoveredStage] = (),
    stall: Stall | None = None,
    description: str = "",
    retry_on_worker_loss: bool = True,
    overlap: Overlap | str = Overlap.SKIP,
    requires_commands: Sequence[str] = (),
    window: Window | None = None,
    debounce: Debounce | None = None,
    throttle: Throttle | None = None,
    while_active: WhileActive | str = WhileActive.JOIN,
    concurrency: Concurrency | None = None,
    limits: Sequence[str] = (),
    retention: Retention | None = None,
) -> TaskDefinition:
    """Declare a task. Assign the result to a module-level name in a module the registry loads."""
    task_id = id

    def fail(field_name: str, problem: str) -> ManifestError:
        return ManifestError(task_id, field_name, problem)

    if not isinstance(task_id, str) or not _TASK_ID.match(task_id):
        raise fail("id", "must be lowercase letters, digits and dashes, starting with a letter")
    if resource_class not in RESOURCE_CLASSES:
        raise fail(
            "resource_class",
            f"unknown class {resource_class!r}; known: {', '.join(RESOURCE_CLASSES)}",
        )
    if pipeline and execute is not None:
        raise fail("execute", "a pipeline task has no execute of its own: its stages do the work")
    if not pipeline and not callable(execute):
        raise fail("execute", "must be callable as execute(ctx, input)")
    if not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
        raise fail("input_model", "must be a pydantic BaseModel subclass")
    if identity_for is not None and not callable(identity_for):
        raise fail("identity_for", "must be callable as identity_for(input) -> str")
    priority = None
    if task_priority is not None:
        try:
            priority = Priority(task_priority)
        except ValueError:
            raise fail("task_priority", f"{task_priority!r} is not one of 1, 2, 3, 5, 7") from None
    # None: the class's default (`tasks.resources.default_timeout`), fixed when the task is
    # declared, so every process that loads the registry holds the same limit.
    timeout = default_timeout(resource_class) if timeout is None else timeout
    if not _valid_timeout(timeout):
        raise fail("timeout", "must be Timeout(soft=timedelta, hard=timedelta), 0 < soft <= hard")
    if not _is_int(processing_version) or processing_version < 1:
        raise fail("processing_version", "must be an integer >= 1")
    stall = Stall() if stall is None else stall
    if problem := _stall_problem(stall):
        raise fail("stall", problem)
    quotas = Quotas() if quotas is None else quotas
    if not isinstance(quotas, Quotas):
        raise fail("quotas", "must be Quotas(max_runs_per_day=, max_concurrent=, rate=)")
    for name in ("max_runs_per_day", "max_concurrent"):
        value = getattr(quotas, name)
        if value is not None and (not _is_int(value) or value < 1):
            raise fail(f"quotas.{name}", "must be a positive integer")
    for kind, cap in dict(quotas.max_cost_per_day).items():
        if not isinstance(kind, str) or not kind or isinstance(cap, bool):
            raise fail("quotas.max_cost_per_day", "must map cost kinds (names) to caps")
        if not isinstance(cap, int | float) or not cap > 0:
            raise fail("quotas.max_cost_per_day", f"the cap of {kind!r} must be a number > 0")
    try:
        quotas.parsed_rate()
    except ValueError as exc:
        raise fail("quotas.rate", str(exc)) from None
    parsed_schedule = None
    if schedule is not None:
        try:
            parsed_schedule = parse_schedule(schedule)
        except (ValueError, TypeError, AttributeError) as exc:
            raise fail("schedule", str(exc)) from None
    try:
        order = stage_order(pipeline)
    except PipelineError as exc:
        raise fail("pipeline", str(exc)) from None
    for stage in pipeline:
        problem = _stage_problem(stage)
        if problem:
            raise fail("pipeline", f"stage {stage.name!r}: {problem}")
    try:
        policy = Backpressure(backpressure)
    except ValueError:
        choices = ", ".join(p.value for p in Backpressure)
        raise fail("backpressure", f"{backpressure!r} is not one of {choices}") from None
    if not _valid_retry(retry):
        raise fail("retry", "must be Retry(max_attempts>=1, base=timedelta, cap=timedelta>=base)")
    if not isinstance(retry_on_worker_loss, bool):
        raise fail("retry_on_worker_loss", "must be True or False")
    try:
        overlap_policy = Overlap(overlap)
    except ValueError:
        choices = ", ".join(o.value for o in Overlap)
        raise fail("overlap", f"{overlap!r} is not one of {choices}") from None
    if isinstance(exclusive_with, str):
        raise fail("exclusive_with", "must be a sequence of task ids, not one string")
    for other in exclusive_with:
        if not isinstance(other, str) or not _TASK_ID.match(other):
            raise fail("exclusive_with", f"{other!r} is not a task id")
    if isinstance(requires_commands, str) or not all(
        isinstance(name, str) and name and "/" not in name for name in requires_commands
    ):
        raise fail("requires_commands", "must be a sequence of program names (no paths)")
    if window is not None and not isinstance(window, Window):
        raise fail("window", 'must be Window("HH:MM-HH:MM", days=, tz=, on_close=)')
    if window is not None and priority == Priority.OPERATOR:
        raise fail("window", "task_priority=1 is an operator's, which passes every window")
    try:
        follow = WhileActive(while_active)
    except ValueError:
        raise fail("while_active", 'must be "join" or "follow_up"') from None
    declared = StartPolicies(debounce, throttle, follow, concurrency)
    limited_otherwise = quotas is not None and quotas.max_concurrent is not None
    if found := declared.problem(identity_for is not None, bool(pipeline), limited_otherwise):
        raise fail(*found)
    if isinstance(limits, str) or not all(isinstance(name, str) for name in limits):
        raise fail("limits", 'must be a sequence of limit ids, e.g. ("tmdb",)')
    if limits and pipeline:
        raise fail("limits", "a pipeline task's stages take limits inside them (ctx.limit)")
    if isinstance(covers_stages, CoveredStage):
        raise fail("covers_stages", "must be a sequence of CoveredStage, not one")
    for covered_stage in covers_stages:
        problem = stage_problem(covered_stage, input_model)
        if problem:
            raise fail("covers_stages", problem)
    covered = tuple(normalised_stage(stage) for stage in covers_stages)
    if len({stage.id for stage in covered}) != len(covered):
        raise fail("covers_stages", "a stage id appears more than once")
    if retention is not None and (problem := retention_problem(retention)):
        raise fail("retention", problem)

    return TaskDefinition(
        id=task_id,
        resource_class=resource_class,
        execute=execute,
        input_model=input_model,
        identity_for=identity_for,
        task_priority=priority,
        timeout=timeout,
        processing_version=processing_version,
        quotas=quotas,
        schedule=parsed_schedule,
        pipeline=tuple(pipeline),
        stage_order=tuple(order),
        backpressure=policy,
        retry=retry,
        exclusive_with=tuple(exclusive_with),
        covers_stages=covered,
        stall=stall,
        description=description,
        retry_on_worker_loss=retry_on_worker_loss,
        overlap=overlap_policy,
        requires_commands=tuple(requires_commands),
        window=window,
        debounce=debounce,
        throttle=throttle,
        while_active=follow,
        concurrency=concurrency,
        limits=tuple(limits),
        retention=retention,
    )


def _stage_problem(stage: Stage) -> str | None:
    if stage.resource_class is not None and stage.resource_class not in RESOURCE_CLASSES:
        return f"unknown resource_class {stage.resource_class!r}"
    if stage.timeout is not None and not _valid_timeout(stage.timeout):
        return "timeout must be Timeout(soft=timedelta, hard=timedelta), 0 < soft <= hard"
    if stage.retry is not None and not _valid_retry(stage.retry):
        return "retry must be Retry(max_attempts>=1, base=timedelta, cap=timedelta>=base)"
    return None


def _stall_problem(stall: object) -> str | None:
    if not isinstance(stall, Stall):
        return "must be Stall(warn=timedelta, fail=timedelta, auto=bool)"
    for name in ("warn", "fail"):
        value = getattr(stall, name)
        if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
            return f"{name} must be a positive timedelta or None"
    if stall.warn is not None and stall.fail is not None and stall.warn >= stall.fail:
        return "warn must come before fail"
    if not isinstance(stall.auto, bool):
        return "auto must be True or False"
    return None


def _valid_timeout(timeout: object) -> bool:
    return (
        isinstance(timeout, Timeout)
        and isinstance(timeout.soft, timedelta)
        and isinstance(timeout.hard, timedelta)
        and timedelta(0) < timeout.soft <= timeout.hard
    )


def _valid_retry(retry: object) -> bool:
    return (
        isinstance(retry, Retry)
        and _is_int(retry.max_attempts)
        and retry.max_attempts >= 1
        and isinstance(retry.base, timedelta)
        and isinstance(retry.cap, timedelta)
        and timedelta(0) < retry.base <= retry.cap
    )


@dataclass(frozen=True)
class WatchSync:
    """A push/pull pair: `push` sends local changes out, `pull` brings remote changes in."""

    push: TaskDefinition
    pull: TaskDefinition


def define_watch_sync(
    id: str,
    *,
    push: Execute,
    pull: Execute,
    resource_class: str = "io",
    **options: Any,
) -> WatchSync:
    """Registers `<id>-push` and `<id>-pull`, sharing every other option."""
    return WatchSync(
        push=define_task(id=f"{id}-push", resource_class=resource_class, execute=push, **options),
        pull=define_task(id=f"{id}-pull", resource_class=resource_class, execute=pull, **options),
    )
