"""The hooks plugged into every run, in order, and the loops that call them.

Order matters at admission: dedup answers before anything is counted, the circuit before the
quota takes a unit, backpressure last, so a refused start consumes nothing and nothing is
shed for a start the quota would refuse.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from orchestrator import keys, valkey
from orchestrator.backpressure import QueueCap
from orchestrator.circuit import CircuitBreaker
from orchestrator.clock import SYSTEM
from orchestrator.concurrency import ConcurrencyLimit
from orchestrator.dedup import IdentityDedup
from orchestrator.hooks import (
    Admission,
    Deduplicated,
    Dropped,
    Outcome,
    Pickup,
    Refused,
    RunHook,
)
from orchestrator.quotas import DailyQuota
from orchestrator.ratelimit import RateLimit

log = logging.getLogger(__name__)

REFUSAL_COUNT_TTL = timedelta(days=8)

# At pickup: the concurrency slot first, then the rate limit, so a run the rate limit
# postpones gives its slot back (before_claim releases the hooks that passed).
HOOKS: tuple[RunHook, ...] = (
    IdentityDedup(),
    CircuitBreaker(),
    DailyQuota(),
    QueueCap(),
    ConcurrencyLimit(),
    RateLimit(),
)


def admit(admission: Admission) -> None:
    """Every hook's admission; if one refuses or deduplicates, those that passed abandon."""
    passed: list[RunHook] = []
    try:
        for hook in HOOKS:
            hook.admit(admission)
            passed.append(hook)
    except (Refused, Dropped) as refused:
        _abandon(passed, admission)
        # Counted in Valkey: the caller's transaction rolls back with a refusal.
        key = keys.refusals(admission.definition.id, SYSTEM.now().date().isoformat())
        pipe = valkey.client().pipeline(transaction=False)
        pipe.hincrby(key, refused.code, 1)
        pipe.expire(key, REFUSAL_COUNT_TTL)
        pipe.execute()  # type: ignore[no-untyped-call]
        raise
    except Deduplicated:
        _abandon(passed, admission)
        raise


def abandon(admission: Admission) -> None:
    """The admitted start will not be inserted after all."""
    _abandon(HOOKS, admission)


def _abandon(hooks: Sequence[RunHook], admission: Admission) -> None:
    for hook in reversed(hooks):
        hook.abandoned(admission)


def before_claim(pickup: Pickup) -> None:
    """Every hook's pre-claim check; if one postpones (or fails), those that passed are released."""
    passed: list[RunHook] = []
    try:
        for hook in HOOKS:
            hook.before_claim(pickup)
            passed.append(hook)
    except BaseException:
        # Not only on Postpone: a hook that failed (Valkey unreachable, the soft time limit)
        # must not leave an earlier hook's concurrency slot taken until its lease runs out.
        for hook in reversed(passed):
            hook.release(pickup)
        raise


def release(pickup: Pickup) -> None:
    for hook in reversed(HOOKS):
        hook.release(pickup)


def finished(outcome: Outcome) -> None:
    # The run has ended in both stores; a hook's failure must not undo or hide that.
    for hook in HOOKS:
        try:
            hook.finished(outcome)
        except Exception:
            log.exception("run %s: hook %s failed after the run ended", outcome.run_id, hook.name)
