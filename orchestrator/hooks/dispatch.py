"""The dispatcher: calls the installed hooks, in order, at each point of a run.

It knows no hook by name: the composition root (`orchestrator.apps`) installs the ordered
chain once, when Django is ready, so this module imports no hook and no hook imports it.

Per-task plans: for each task definition it compiles, once, the tuple of hooks each point
calls: the hooks of the chain, in chain order, that apply to the task (`RunHook.applies`) and
override that point's method (`Plan`). Every point iterates only its tuple, so a hook a task
does not declare (no identity, limit, rate or cost cap) costs its runs nothing, and a point no
hook of the task takes part in (a heartbeat without a concurrency limit) sends nothing. Plans
are compiled on first use per definition and kept while the chain and the registry they were
compiled against stay installed (a registry or a chain installed again, by a test, drops them);
a definition that is not the registry's own (a stage watched under its own timeout) gets a
plan compiled for it, not kept.

Three kinds of hook take part only when the run says so, and are kept apart in the plan: a
hook `excused_at_admission` judges a start only when the admission script asks (then the
whole chain, `admit_all`, admits it; the script, `admit_run.lua`, goes first in admission's
pipeline), one with a `pickup_note` takes part at pickup only for a message carrying that note
(`before_claim_noted`), and one `excused_at_end` hears of a run's end only when the end's own
script asks (`finished_asked`). The run code reads a task's plan from `plans` without a call (a
plan whose `definition` is not the caller's is not its own: `plan` compiles it), so a task none
of whose hooks takes part at a point runs no code of this package there.

At each planned point it collects each hook's `Part` and sends the parts' commands in one
coordination Valkey pipeline, then hands each hook its replies in chain order; a part marked
`after_replies` first has the parts before it sent and received. So a task with no limits
pays one round trip for all hooks at each point, not one per hook. A hook whose commands were
sent counts as passed (its effect happened) until its own verdict raises: then it is left out
of the give-back (`abandoned`, `release`), as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from redis.client import Pipeline

from orchestrator.clock import SYSTEM
from orchestrator.hooks.base import (
    Admission,
    Beat,
    Deduplicated,
    Dropped,
    Outcome,
    Part,
    Pickup,
    Refused,
    Republished,
    RunHook,
    StagePickup,
)
from orchestrator.stores import counters, keys, live, valkey
from tasks import registry
from tasks.definition import TaskDefinition

log = logging.getLogger(__name__)

REFUSAL_COUNT_TTL = timedelta(days=8)

_chain: tuple[RunHook, ...] = ()


@dataclass(frozen=True)
class Plan:
    """The hooks one task's runs go through at each point, in chain order."""

    definition: TaskDefinition
    admit: tuple[RunHook, ...]  # without the hooks the admission script may excuse
    admit_all: tuple[RunHook, ...]  # all of them: when the admission script asks
    abandoned: tuple[RunHook, ...]
    before_claim: tuple[RunHook, ...]  # without the hooks that wait for a note
    before_claim_noted: tuple[RunHook, ...]  # all of them: for a message carrying notes
    release: tuple[RunHook, ...]
    before_stage: tuple[RunHook, ...]
    heartbeat: tuple[RunHook, ...]
    republished: tuple[RunHook, ...]
    finished: tuple[RunHook, ...]  # without the hooks the end's script may excuse
    finished_asked: tuple[RunHook, ...]  # those: told only when the script asks

    def hooks(self) -> tuple[RunHook, ...]:
        """Every hook that takes part in at least one point, in chain order."""
        points = (
            self.admit_all,
            self.abandoned,
            self.before_claim_noted,
            self.release,
            self.before_stage,
            self.heartbeat,
            self.republished,
            self.finished,
            self.finished_asked,
        )
        return tuple(hook for hook in _chain if any(_among(hook, point) for point in points))


# Compiled plans by task id, and the registry they were compiled against.
plans: dict[str, Plan] = {}
_plans_for: object = None


def install(hooks: Sequence[RunHook]) -> None:
    """Set the chain every run goes through (the composition root, at startup)."""
    global _chain
    _chain = tuple(hooks)
    plans.clear()


def installed() -> tuple[RunHook, ...]:
    return _chain


def _among(hook: RunHook, hooks: Sequence[RunHook]) -> bool:
    return any(other is hook for other in hooks)


def _compile(definition: TaskDefinition) -> Plan:
    applying = [hook for hook in _chain if hook.applies(definition)]

    def taking_part(point: str) -> tuple[RunHook, ...]:
        unchanged = getattr(RunHook, point)
        return tuple(
            hook
            for hook in applying
            if getattr(type(hook), point) is not unchanged and hook.takes_part(point, definition)
        )

    admit = taking_part("plan_admit")
    before_claim = taking_part("plan_before_claim")
    finished = taking_part("plan_finished")
    return Plan(
        definition,
        admit=tuple(hook for hook in admit if not hook.excused_at_admission),
        admit_all=admit,
        abandoned=taking_part("abandoned"),
        before_claim=tuple(hook for hook in before_claim if hook.pickup_note is None),
        before_claim_noted=before_claim,
        release=taking_part("release"),
        before_stage=taking_part("plan_before_stage"),
        heartbeat=taking_part("plan_heartbeat"),
        republished=taking_part("plan_republished"),
        finished=tuple(hook for hook in finished if not hook.excused_at_end),
        finished_asked=tuple(hook for hook in finished if hook.excused_at_end),
    )


def plan(definition: TaskDefinition) -> Plan:
    """`definition`'s plan: compiled on first use, kept while its registry is installed."""
    global _plans_for
    tasks = registry.get()
    if tasks is not _plans_for:
        plans.clear()
        _plans_for = tasks
    compiled = plans.get(definition.id)
    if compiled is not None and compiled.definition is definition:
        return compiled
    compiled = _compile(definition)
    if tasks.get(definition.id) is definition:
        plans[definition.id] = compiled
    return compiled


class _Round:
    """The parts of one point: queued into one pipeline, sent when a part needs the replies
    before it (or at the end), received in chain order."""

    def __init__(self, passed: list[RunHook]) -> None:
        self.passed = passed
        self._pipe: Pipeline | None = None
        # hook, its part, where its replies start in the pipeline, how many
        self._queued: list[tuple[RunHook, Part, int, int]] = []
        # the caller's own parts and where their replies start, received before the hooks'
        self._first: Part | None = None  # its replies lead the pipeline
        self._last: tuple[Part, int] | None = None

    def run(
        self,
        planned: Iterable[tuple[RunHook, Part | None]],
        last: Part | None = None,
        *,
        first: Part | None = None,
    ) -> None:
        """`first` (the caller's own commands) goes before the hooks' in the pipeline and is
        received first, before the hooks are counted as passed or hear their replies: it may
        raise, and then no hook judged anything (those whose commands were sent have passed)."""
        if first is not None:
            self._first = first
            if first.send is not None:
                first.send(self._pipeline())
        for hook, part in planned:
            if part is None:
                self.passed.append(hook)
                continue
            if part.after_replies:
                self.flush()
            pipe = self._pipeline()
            start = len(pipe)
            if part.send is not None:
                part.send(pipe)
            self._queued.append((hook, part, start, len(pipe) - start))
        if last is not None:
            pipe = self._pipeline()
            self._last = (last, len(pipe))
            if last.send is not None:
                last.send(pipe)
        self.flush()

    def _pipeline(self) -> Pipeline:
        if self._pipe is None:
            self._pipe = valkey.client().pipeline(transaction=False)
        return self._pipe

    def flush(self) -> None:
        queued, self._queued = self._queued, []
        pipe, self._pipe = self._pipe, None
        replies: list[Any] = valkey.execute(pipe, raise_on_error=False) if pipe else []
        # Sent: their effects happened, so they are given back if a later verdict refuses.
        self.passed.extend(hook for hook, *_ in queued)
        if self._first is not None:
            lead, self._first = self._first, None
            lead.receive(replies[: queued[0][2] if queued else len(replies)])
        if self._last is not None:
            last, first = self._last
            self._last = None
            last.receive(replies[first:])
        for hook, part, first, count in queued:
            try:
                part.receive(replies[first : first + count])
            except BaseException:
                self.passed.remove(hook)
                raise


class _Asked(Exception):
    """The admission script found a start the hooks it may excuse must judge."""


class _Check:
    """The admission script (`admit_run.lua`) as the first part of admission's pipeline: the
    start counted in its task's day, and whether the excusable hooks must judge it."""

    def __init__(self, admission: Admission, excusable: bool) -> None:
        self.admission = admission
        self.excusable = excusable  # the plan has hooks the script may excuse
        self.counted = False
        self._read: Callable[[Any], bool] | None = None

    def part(self) -> Part:
        return Part(self._receive, self._send)

    def _send(self, pipe: Pipeline) -> None:
        definition = self.admission.definition
        pauses = live.Pauses.of(definition.id, definition.resource_class)
        self._read = live.queue_admission(pipe, definition.id, pauses, not definition.quotas.capped)

    def _receive(self, replies: list[Any]) -> None:
        assert self._read is not None
        asked = self._read(replies[0])
        self.counted = not self.admission.definition.quotas.capped
        if asked and self.excusable:
            raise _Asked()

    def give_back(self) -> None:
        if self.counted:
            live.give_back_start(self.admission.definition.id)


def admit(admission: Admission) -> None:
    """Every hook's admission; if one refuses or deduplicates, those that passed abandon.

    The admission script goes first, in the same pipeline: the hooks it may excuse (pause,
    circuit) judge the start only when it asks, and then the whole chain admits it again,
    after those that passed the first time abandoned."""
    planned = plan(admission.definition)
    check = _Check(admission, excusable=len(planned.admit_all) > len(planned.admit))
    passed: list[RunHook] = []
    try:
        _Round(passed).run(
            ((hook, hook.plan_admit(admission)) for hook in planned.admit), first=check.part()
        )
    except _Asked:
        _abandon(passed, admission)
        admit_asked(admission)
    except (Refused, Dropped, Deduplicated) as refused:
        _abandon(passed, admission)
        check.give_back()
        refuse(admission, refused)
        raise


def admit_asked(admission: Admission) -> None:
    """The admission script, sent alone, asked the hooks it may excuse to judge the start:
    the whole chain admits it; a refusal gives back what the hooks that passed and the script
    took."""
    passed: list[RunHook] = []
    planned = plan(admission.definition)
    try:
        _Round(passed).run((hook, hook.plan_admit(admission)) for hook in planned.admit_all)
    except (Refused, Dropped, Deduplicated) as refused:
        _abandon(passed, admission)
        if not admission.definition.quotas.capped:
            live.give_back_start(admission.definition.id)
        refuse(admission, refused)
        raise


def refuse(admission: Admission, refused: Exception) -> None:
    """A refused or dropped start is counted in Valkey (the caller's transaction rolls back
    with it); a deduplicated one is not a refusal."""
    if not isinstance(refused, Refused | Dropped):
        return
    key = keys.refusals(admission.definition.id, SYSTEM.now().date().isoformat())
    pipe = valkey.client().pipeline(transaction=False)
    pipe.hincrby(key, refused.code, 1)
    pipe.expire(key, REFUSAL_COUNT_TTL)
    counters.add(counters.REFUSALS, (admission.definition.id, refused.code), 1, pipe)
    valkey.execute(pipe)


def abandon(admission: Admission) -> None:
    """The admitted start will not be inserted after all."""
    for hook in reversed(plan(admission.definition).abandoned):
        hook.abandoned(admission)
    if not admission.definition.quotas.capped:
        live.give_back_start(admission.definition.id)


def _abandon(passed: Sequence[RunHook], admission: Admission) -> None:
    for hook in reversed(plan(admission.definition).abandoned):
        if _among(hook, passed):
            hook.abandoned(admission)


def before_claim(pickup: Pickup, *, last: Part | None = None) -> None:
    """Every hook's pre-claim check; if one postpones (or fails), those that passed are released.
    `last` (the caller's own command: the claim) goes after the hooks' in the same pipeline
    and runs whatever they decide: its `receive`, called first, must not raise, and the
    caller undoes it when a hook postpones."""
    hooks = plan(pickup.definition)
    taking_part = hooks.before_claim_noted if pickup.notes else hooks.before_claim
    passed: list[RunHook] = []
    try:
        _Round(passed).run(((hook, hook.plan_before_claim(pickup)) for hook in taking_part), last)
    except BaseException:
        # Not only on Postpone: a hook that failed (Valkey unreachable, the soft time limit)
        # must not leave an earlier hook's concurrency slot taken until its lease runs out.
        for hook in reversed(hooks.release):
            if _among(hook, passed):
                hook.release(pickup)
        raise


def release(pickup: Pickup) -> None:
    for hook in reversed(plan(pickup.definition).release):
        hook.release(pickup)


def before_stage(stage: StagePickup) -> None:
    """Every hook's check of a pipeline stage's message before its claim (`Parked`: held)."""
    hooks = plan(stage.definition).before_stage
    if hooks:
        _Round([]).run((hook, hook.plan_before_stage(stage)) for hook in hooks)


def heartbeat(definition: TaskDefinition, run_id: str, owner: str) -> None:
    """A running run's Valkey heartbeat, heard by the hooks that keep something alive for it
    (`owner`: the run's claim). Nothing is sent for a task none of whose hooks does."""
    hooks = plan(definition).heartbeat
    if hooks:
        beat = Beat(definition, run_id, owner)
        _Round([]).run((hook, hook.plan_heartbeat(beat)) for hook in hooks)


def republished(run: Republished) -> None:
    """A live run published or seeded again by recovery: the hooks take again what its start
    took in Valkey. A hook's failure is logged, never raised: the publish goes on."""
    hooks = plan(run.definition).republished
    if hooks:
        _each(
            hooks,
            lambda hook: hook.plan_republished(run),
            run.run_id,
            "as the run was published again",
        )


def finished(outcome: Outcome, hooks: Sequence[RunHook], *, first: Part | None = None) -> None:
    """The end-of-run part of `hooks` (the plan's `finished`, `finished_asked`, or both).
    `first` (the caller's own command, e.g. the live hash's move) goes first in the same
    pipeline; its `receive` must not raise."""
    # The run has ended in Postgres; a hook's failure must not undo or hide that.
    _each(
        hooks,
        lambda hook: hook.plan_finished(outcome),
        outcome.run_id,
        "after the run ended",
        first,
    )


def _each(
    hooks: Sequence[RunHook],
    plan_of: Callable[[RunHook], Part | None],
    run_id: str,
    when: str,
    first: Part | None = None,
) -> None:
    """The parts of hooks independent of each other, in one pipeline: each verdict is
    received, and logged if it fails; none is raised."""
    planned: list[tuple[RunHook, Part]] = []
    for hook in hooks:
        try:
            part = plan_of(hook)
        except Exception:
            _failed(run_id, hook, when)
            continue
        if part is not None:
            planned.append((hook, part))
    replies: list[Any] = []
    pipe = valkey.client().pipeline(transaction=False)
    if first is not None and first.send is not None:
        first.send(pipe)
    lead = len(pipe)
    spans = []
    for _, part in planned:
        start = len(pipe)
        if part.send is not None:
            part.send(pipe)
        spans.append((start, len(pipe) - start))
    if len(pipe):
        try:
            replies = valkey.execute(pipe, raise_on_error=False)
        except Exception as exc:
            # Valkey unreachable: every hook that sent something failed with it.
            replies = [exc] * len(pipe)
    if first is not None:
        first.receive(replies[:lead])
    for (hook, part), (start, count) in zip(planned, spans, strict=True):
        try:
            part.receive(replies[start : start + count])
        except Exception:
            _failed(run_id, hook, when)


def _failed(run_id: str, hook: RunHook, when: str) -> None:
    log.exception("run %s: hook %s failed %s", run_id, hook.name, when)
