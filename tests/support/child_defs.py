"""Tasks that fan out (issue 40): a pipeline whose `scan` spawns children and whose
`collections` awaits them, the child task, and a batch callback that records what it got."""

from __future__ import annotations

import json
import os
import time

from pydantic import BaseModel, Field

from orchestrator.stores import valkey
from tasks import PermanentError, Stage, TaskContext, define_task

CHILD_RECORD = "test:children:ran"  # one JSON entry per child handler call: its n and pid
WAITED_RECORD = "test:children:waited"  # one JSON entry per `collections` call
CALLBACK_RECORD = "test:children:callback"  # one JSON entry per callback call
FAILING = "test:children:failing"  # while it exists, a child whose input says `fail` fails


class FanOut(BaseModel, extra="forbid"):
    count: int
    fail: list[int] = []  # children that fail permanently
    seconds: float = 0.0  # each child's work
    on_failure: str = "fail_parent"
    grandchildren: int = 0  # each child spawns this many of its own
    nested: int = 0  # > 0: the children are fan-outs themselves, of this many slow children
    linger: float = 0.0  # the scan's work after spawning, deaf to a cancel


class ChildInput(BaseModel, extra="forbid"):
    n: int
    fail: bool = False
    seconds: float = 0.0
    grandchildren: int = Field(0, ge=0)


def _scan(ctx: TaskContext, params: FanOut) -> dict[str, int]:
    inputs = [
        {
            "n": n,
            "fail": n in params.fail,
            "seconds": params.seconds,
            "grandchildren": params.grandchildren,
        }
        for n in range(params.count)
    ]
    if params.nested:
        nested = {"count": params.nested, "seconds": params.seconds, "on_failure": "continue"}
        ids = ctx.spawn("test-fan-out", [nested] * params.count, on_failure="continue")
    else:
        ids = ctx.spawn("test-child", inputs, on_failure=params.on_failure)  # type: ignore[arg-type]
    time.sleep(params.linger)
    return {"spawned": len(ids)}


def _collections(ctx: TaskContext, params: FanOut) -> dict[str, int]:
    children = ctx.children("scan")
    states: dict[str, int] = {}
    for child in children:
        states[child.state] = states.get(child.state, 0) + 1
    total = sum(child.result["n"] for child in children if child.state == "completed")
    entry = {"run": ctx.run_id, "states": states, "sum": total, "at": time.time()}
    valkey.client().rpush(WAITED_RECORD, json.dumps(entry))
    return {"children": len(children), "sum": total}


fan_out = define_task(
    id="test-fan-out",
    resource_class="io",
    input_model=FanOut,
    pipeline=[
        Stage(name="scan", execute=_scan),
        Stage(name="collections", execute=_collections, after=("scan",), await_children=True),
    ],
)


def _child(ctx: TaskContext, params: ChildInput) -> dict[str, int]:
    valkey.client().rpush(CHILD_RECORD, json.dumps({"n": params.n, "pid": os.getpid()}))
    if params.fail and valkey.client().exists(FAILING):
        raise PermanentError(f"child {params.n} fails as asked")
    ctx.sleep(params.seconds)
    if params.grandchildren:
        inputs = [{"n": params.n * 1000 + g} for g in range(params.grandchildren)]
        ctx.spawn("test-child", inputs, on_failure="continue")
    return {"n": params.n}


child = define_task(id="test-child", resource_class="io", execute=_child, input_model=ChildInput)


class CallbackInput(BaseModel, extra="forbid"):
    label: str
    batch_id: str
    counts: dict[str, int]


def _callback(ctx: TaskContext, params: CallbackInput) -> None:
    entry = {"label": params.label, "batch": params.batch_id, "counts": params.counts}
    valkey.client().rpush(CALLBACK_RECORD, json.dumps(entry))


callback = define_task(
    id="test-batch-callback", resource_class="io", execute=_callback, input_model=CallbackInput
)


class SpawnerInput(BaseModel, extra="forbid"):
    count: int
    then_fail: bool = False  # the handler fails after spawning: its children are not written


def _spawner(ctx: TaskContext, params: SpawnerInput) -> dict[str, list[str]]:
    ids = ctx.spawn("test-child", [{"n": n} for n in range(params.count)], priority=5)
    if params.then_fail:
        raise PermanentError("fails after spawning, as asked")
    return {"children": ids}


# A plain task (no pipeline) whose handler spawns children, written with its run's end.
spawner = define_task(
    id="test-spawner", resource_class="io", execute=_spawner, input_model=SpawnerInput
)
