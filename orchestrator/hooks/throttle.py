"""Throttle (issue 39): at most one run per identity per period, for a task that declares
`throttle=Throttle(period_s)`.

A `RunHook` at admission, first in the chain (before identity dedup, so a start while the
period's run is still live is answered `throttled`, not `deduplicated`): one `SET task:
throttle:<taskId>:<identity> <runId> NX GET PX <provisional>` in the admission's pipeline, and
the key's time left. The first start of a period takes the key, held for
LUMASTRA_IDENTITY_PROVISIONAL_TTL_S until its run commits and for the period from then on
(`Admission.committed`), so a start whose transaction never commits blocks its identity for
seconds, not a period; a later start is answered `throttled` (`Throttled`, a `Deduplicated`:
nothing written, nothing counted) with the run it met and when the next may start. A start
refused or dropped after it took the key gives it back (`abandoned`). An operator's retry is
never throttled.

Not guaranteed: the period is Valkey's: a Valkey that lost the key (a restart without
persistence) lets the next start through early; a start answered within the provisional
seconds may name a run its caller's transaction then rolls back.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings

from orchestrator.clock import SYSTEM
from orchestrator.hooks.base import Admission, Part, RunHook, Throttled, checked
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks.definition import TaskDefinition

log = logging.getLogger(__name__)


class ThrottleGate(RunHook):
    def __init__(self) -> None:
        super().__init__(name="throttle")

    def applies(self, definition: TaskDefinition) -> bool:
        return definition.throttle is not None

    def plan_admit(self, admission: Admission) -> Part | None:
        throttle = admission.definition.throttle
        if throttle is None or admission.trigger.get("kind") == TriggerKind.OPERATOR_RETRY:
            return None
        key = keys.throttle(admission.definition.id, admission.identity)
        provisional_ms = settings.CONFIG.identity_provisional_ttl_s * 1000

        def send(pipe: Any) -> None:
            pipe.set(key, admission.run_id, nx=True, get=True, px=provisional_ms)
            pipe.pttl(key)

        def receive(replies: list[Any]) -> None:
            holder, left_ms = checked(replies)
            if holder is not None:
                next_at = SYSTEM.now() + timedelta(milliseconds=max(0, int(left_ms)))
                raise Throttled(str(holder), next_at)
            admission.committed.append(partial(_hold, key, admission.run_id, throttle.period_s))

        return Part(receive, send)

    def abandoned(self, admission: Admission) -> None:
        key = keys.throttle(admission.definition.id, admission.identity)
        valkey.script("identity_hold", [key], [admission.run_id, 0])


def _hold(key: str, run_id: str, period_s: int) -> None:
    """The committed run holds its identity's period (from its commit)."""
    try:
        valkey.script("identity_hold", [key], [run_id, period_s * 1000])
    except Exception:
        log.exception("run %s: its throttle period not held; it lapses within seconds", run_id)
