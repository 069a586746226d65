"""The dispatcher: calls the installed hooks, in order, at each point of a run.

It knows no hook by name: the composition root (`orchestrator.apps`) installs the ordered
chain once, when Django is ready, so this module imports no hook and no hook imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from orchestrator.clock import SYSTEM
from orchestrator.hooks.base import (
    Admission,
    Deduplicated,
    Dropped,
    Outcome,
    Pickup,
    Refused,
    RunHook,
)
from orchestrator.stores import keys, valkey

log = logging.getLogger(__name__)

REFUSAL_COUNT_TTL = timedelta(days=8)

_chain: tuple[RunHook, ...] = ()


def install(hooks: Sequence[RunHook]) -> None:
    """Set the chain every run goes through (the composition root, at startup)."""
    global _chain
    _chain = tuple(hooks)


def installed() -> tuple[RunHook, ...]:
    return _chain


def admit(admission: Admission) -> None:
    """Every hook's admission; if one refuses or deduplicates, those that passed abandon."""
    passed: list[RunHook] = []
    try:
        for hook in _chain:
            hook.admit(admission)
            passed.append(hook)
    except (Refused, Dropped) as refused:
        _abandon(passed, admission)
        # Counted in Valkey: the caller's transaction rolls back with a refusal.
        key = keys.refusals(admission.definition.id, SYSTEM.now().date().isoformat())
        pipe = valkey.client().pipeline(transaction=False)
        pipe.hincrby(key, refused.code, 1)
        pipe.expire(key, REFUSAL_COUNT_TTL)
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


def before_claim(pickup: Pickup) -> None:
    """Every hook's pre-claim check; if one postpones (or fails), those that passed are released."""
    passed: list[RunHook] = []
    try:
        for hook in _chain:
            hook.before_claim(pickup)
            passed.append(hook)
    except BaseException:
        # Not only on Postpone: a hook that failed (Valkey unreachable, the soft time limit)
        # must not leave an earlier hook's concurrency slot taken until its lease runs out.
        for hook in reversed(passed):
            hook.release(pickup)
        raise


def release(pickup: Pickup) -> None:
    for hook in reversed(_chain):
        hook.release(pickup)


def finished(outcome: Outcome) -> None:
    # The run has ended in both stores; a hook's failure must not undo or hide that.
    for hook in _chain:
        try:
            hook.finished(outcome)
        except Exception:
            log.exception("run %s: hook %s failed after the run ended", outcome.run_id, hook.name)
