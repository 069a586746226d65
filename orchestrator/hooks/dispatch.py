"""The dispatcher: calls the installed hooks, in order, at each point of a run.

It knows no hook by name: the composition root (`orchestrator.apps`) installs the ordered
chain once, when Django is ready, so this module imports no hook and no hook imports it.

At `admit`, `before_claim` and `finished` it collects each hook's `Part` and sends the parts'
commands in one coordination Valkey pipeline, then hands each hook its replies in chain
order; a part marked `after_replies` first has the parts before it sent and received. So a
task with no limits pays one round trip for all hooks at each point, not one per hook.
A hook whose commands were sent counts as passed (its effect happened) until its own
verdict raises: then it is left out of the give-back (`abandoned`, `release`), as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

from redis.client import Pipeline

from orchestrator.clock import SYSTEM
from orchestrator.hooks.base import (
    Admission,
    Deduplicated,
    Dropped,
    Outcome,
    Part,
    Pickup,
    Refused,
    RunHook,
)
from orchestrator.stores import counters, keys, valkey

log = logging.getLogger(__name__)

REFUSAL_COUNT_TTL = timedelta(days=8)

_chain: tuple[RunHook, ...] = ()


def install(hooks: Sequence[RunHook]) -> None:
    """Set the chain every run goes through (the composition root, at startup)."""
    global _chain
    _chain = tuple(hooks)


def installed() -> tuple[RunHook, ...]:
    return _chain


class _Round:
    """The parts of one point: queued into one pipeline, sent when a part needs the replies
    before it (or at the end), received in chain order."""

    def __init__(self, passed: list[RunHook]) -> None:
        self.passed = passed
        self._pipe: Pipeline | None = None
        # hook, its part, where its replies start in the pipeline, how many
        self._queued: list[tuple[RunHook, Part, int, int]] = []
        # the caller's own part and where its replies start, received before the hooks'
        self._last: tuple[Part, int] | None = None

    def run(self, planned: Iterable[tuple[RunHook, Part | None]], last: Part | None = None) -> None:
        for hook, part in planned:
            if part is None:
                self.passed.append(hook)
                continue
            if part.after_replies:
                self.flush()
            pipe = self._pipeline()
            first = len(pipe)
            part.send(pipe)
            self._queued.append((hook, part, first, len(pipe) - first))
        if last is not None:
            pipe = self._pipeline()
            self._last = (last, len(pipe))
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
        if self._last is not None:
            last, first = self._last
            self._last = None
            last.receive(replies[first:])
        # Sent: their effects happened, so they are given back if a later verdict refuses.
        self.passed.extend(hook for hook, *_ in queued)
        for hook, part, first, count in queued:
            try:
                part.receive(replies[first : first + count])
            except BaseException:
                self.passed.remove(hook)
                raise


def _planned(
    plan: Callable[[RunHook], Part | None],
) -> Iterable[tuple[RunHook, Part | None]]:
    return ((hook, plan(hook)) for hook in _chain)


def admit(admission: Admission) -> None:
    """Every hook's admission; if one refuses or deduplicates, those that passed abandon."""
    passed: list[RunHook] = []
    try:
        _Round(passed).run(_planned(lambda hook: hook.plan_admit(admission)))
    except (Refused, Dropped) as refused:
        _abandon(passed, admission)
        # Counted in Valkey: the caller's transaction rolls back with a refusal.
        key = keys.refusals(admission.definition.id, SYSTEM.now().date().isoformat())
        pipe = valkey.client().pipeline(transaction=False)
        pipe.hincrby(key, refused.code, 1)
        pipe.expire(key, REFUSAL_COUNT_TTL)
        counters.add(counters.REFUSALS, (admission.definition.id, refused.code), 1, pipe)
        valkey.execute(pipe)
        raise
    except Deduplicated:
        _abandon(passed, admission)
        raise


def abandon(admission: Admission) -> None:
    """The admitted start will not be inserted after all."""
    _abandon(_chain, admission)


def _abandon(hooks: Sequence[RunHook], admission: Admission) -> None:
    for hook in reversed(hooks):
        hook.abandoned(admission)


def before_claim(pickup: Pickup, *, last: Part | None = None) -> None:
    """Every hook's pre-claim check; if one postpones (or fails), those that passed are released.
    `last` (the caller's own command: the claim) goes after the hooks' in the same pipeline
    and runs whatever they decide: its `receive`, called first, must not raise, and the
    caller undoes it when a hook postpones."""
    passed: list[RunHook] = []
    try:
        _Round(passed).run(_planned(lambda hook: hook.plan_before_claim(pickup)), last)
    except BaseException:
        # Not only on Postpone: a hook that failed (Valkey unreachable, the soft time limit)
        # must not leave an earlier hook's concurrency slot taken until its lease runs out.
        for hook in reversed(passed):
            hook.release(pickup)
        raise


def release(pickup: Pickup) -> None:
    for hook in reversed(_chain):
        hook.release(pickup)


def finished(outcome: Outcome, *, first: Part | None = None) -> None:
    """Every hook's end-of-run part. `first` (the caller's own command, e.g. the live hash's
    move) goes first in the same pipeline; its `receive` must not raise."""
    # The run has ended in Postgres; a hook's failure must not undo or hide that. The
    # hooks' parts are independent here: each verdict is received, and logged if it fails.
    planned: list[tuple[RunHook, Part]] = []
    for hook in _chain:
        try:
            part = hook.plan_finished(outcome)
        except Exception:
            _finish_failed(outcome, hook)
            continue
        if part is not None:
            planned.append((hook, part))
    replies: list[Any] = []
    pipe = valkey.client().pipeline(transaction=False)
    if first is not None:
        first.send(pipe)
    lead = len(pipe)
    spans = []
    for _, part in planned:
        start = len(pipe)
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
            _finish_failed(outcome, hook)


def _finish_failed(outcome: Outcome, hook: RunHook) -> None:
    log.exception("run %s: hook %s failed after the run ended", outcome.run_id, hook.name)
