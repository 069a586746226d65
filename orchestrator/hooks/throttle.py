"""Throttle (issue 39): at most one run per identity per period, for a task that declares
`throttle=Throttle(period_s)`.

A `RunHook` at admission, right after identity dedup: one `SET task:throttle:<taskId>:
<identity> <runId> NX PX <period>` in the admission's pipeline, with the holder and its time
left read beside it. The first start of a period takes the key and goes on; a later one is
answered `throttled` (`Throttled`, a `Deduplicated`: nothing written, nothing counted) with the
run it met and when the next may start. A start refused or dropped after it took the key
gives it back (`abandoned`), so a refusal does not block its identity for a period.

Not guaranteed: the period is Valkey's: a Valkey that lost the key (a restart without
persistence) lets the next start through early.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from orchestrator.clock import SYSTEM
from orchestrator.hooks.base import Admission, Part, RunHook, Throttled, checked
from orchestrator.stores import keys, valkey
from tasks.definition import TaskDefinition


class ThrottleGate(RunHook):
    def __init__(self) -> None:
        super().__init__(name="throttle")

    def applies(self, definition: TaskDefinition) -> bool:
        return definition.throttle is not None

    def plan_admit(self, admission: Admission) -> Part | None:
        throttle = admission.definition.throttle
        if throttle is None:
            return None
        key = keys.throttle(admission.definition.id, admission.identity)

        def send(pipe: Any) -> None:
            pipe.set(key, admission.run_id, nx=True, px=throttle.period_s * 1000)
            pipe.get(key)
            pipe.pttl(key)

        def receive(replies: list[Any]) -> None:
            taken, holder, left_ms = checked(replies)
            if not taken and holder:
                next_at = SYSTEM.now() + timedelta(milliseconds=max(0, int(left_ms)))
                raise Throttled(str(holder), next_at)

        return Part(receive, send)

    def abandoned(self, admission: Admission) -> None:
        key = keys.throttle(admission.definition.id, admission.identity)
        valkey.script("identity_hold", [key], [admission.run_id, 0])
