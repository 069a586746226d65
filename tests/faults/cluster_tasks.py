"""The partition scenarios' registry (LUMASTRA_TASK_MODULES for their hosts and driver): the
battery's slow-progress task and its pipeline, so each host's real worker role plans two
pools (io, cpu) rather than one per class of the whole test registry.

Also the children scenario's tasks (`tests.faults.scenarios.children`), which the test
registry does not name: that scenario adds this module to its own processes' registry. A
fan-out pipeline, `test-fault-fan`, whose `scan` spawns `count` children of
`test-fault-child` (each `low_ms`..`high_ms` of work, `on_failure="continue"`) and whose
`gather` awaits them and returns what it saw (kept in `task_history.stage_results`, which
survives a Valkey restart); every stage and child records its entries as the other fault
tasks do (`tests.support.task_defs._executing`), for the checker's "at most once per claim"
and "never twice at the same time".
"""

from __future__ import annotations

import os
import random
import secrets
from datetime import timedelta

from pydantic import BaseModel, Field

from tasks import Retry, Stage, TaskContext, define_task
from tests.support.task_defs import FAULT_TIMEOUT, _executing, fault_pipe, fault_resume

__all__ = ["fault_child", "fault_fan", "fault_pipe", "fault_resume"]

# Attempts enough that none runs out of them under a scenario's faults (as test-fault-resume).
FAULT_RETRY = Retry(max_attempts=6, base=timedelta(milliseconds=300), cap=timedelta(seconds=2))
CHILD_TASK = "test-fault-child"


class FaultFanInput(BaseModel, extra="forbid"):
    # Unique per parent: its identity, and its children's (a child's default identity is its
    # input's digest, so two parents' children must not have the same input).
    label: str
    count: int = Field(ge=1)
    low_ms: int = 20
    high_ms: int = 150


class FaultChildInput(BaseModel, extra="forbid"):
    parent: str
    # The scan attempt that spawned it: a lost attempt may leave its children's identities
    # held for a while (`runs.children`, "Not guaranteed"), which the next one must not meet.
    attempt: str
    n: int
    ms: int


def _fan_scan(ctx: TaskContext, params: FaultFanInput) -> dict[str, int]:
    with _executing(ctx.run_id, "scan"):
        rng = random.Random(params.label)  # each attempt's children do the same work
        attempt = secrets.token_hex(4)
        inputs = [
            {
                "parent": params.label,
                "attempt": attempt,
                "n": n,
                "ms": rng.randint(params.low_ms, params.high_ms),
            }
            for n in range(params.count)
        ]
        ids = ctx.spawn(CHILD_TASK, inputs, on_failure="continue")
        return {"spawned": len(ids)}


def _fan_gather(ctx: TaskContext, params: FaultFanInput) -> dict[str, int]:
    with _executing(ctx.run_id, "gather"):
        children = ctx.children("scan")
        completed = sum(1 for child in children if child.state == "completed")
        return {"children": len(children), "completed": completed}


fault_fan = define_task(
    id="test-fault-fan",
    resource_class="io",
    input_model=FaultFanInput,
    timeout=FAULT_TIMEOUT,
    retry=FAULT_RETRY,
    pipeline=[
        Stage(name="scan", execute=_fan_scan),
        Stage(name="gather", execute=_fan_gather, after=("scan",), await_children=True),
    ],
)


def _fault_child(ctx: TaskContext, params: FaultChildInput) -> dict[str, int]:
    with _executing(ctx.run_id):
        ctx.sleep(params.ms / 1000)
        return {"n": params.n, "pid": os.getpid()}


fault_child = define_task(
    id=CHILD_TASK,
    resource_class="io",
    execute=_fault_child,
    input_model=FaultChildInput,
    timeout=FAULT_TIMEOUT,
    retry=FAULT_RETRY,
)
