"""The tasks the benchmarks run through Lumastra (loaded via LUMASTRA_TASK_MODULES).

They do nothing, so what a benchmark measures is the engine around them: start_run, the
broker, the worker pool and the runner's reads and writes; for `bench-pipe4`, a pipeline's
stage claims, ends and advances (bench/pipeline.py); for `bench-chatty`, the live log and
progress (bench/observability.py); for the `bench-keyed-*` four, what a debounce, a throttle
and a keyed concurrency add to a start (bench/coalescing.py); for `bench-fan-out`, children
spawned by a stage and a stage that awaits them (bench/children.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tasks import (
    Concurrency,
    Debounce,
    NoInput,
    Stage,
    TaskContext,
    Throttle,
    define_task,
)


def _noop(ctx: TaskContext, params: NoInput) -> None:
    return None


noop = define_task(id="bench-noop", resource_class="io", execute=_noop)

# Four no-op stages in a chain: every stage waits for the one before it.
pipe4 = define_task(
    id="bench-pipe4",
    resource_class="io",
    pipeline=[
        Stage(name="a", execute=_noop),
        Stage(name="b", execute=_noop, after=("a",)),
        Stage(name="c", execute=_noop, after=("b",)),
        Stage(name="d", execute=_noop, after=("c",)),
    ],
)


def _chatty(ctx: TaskContext, params: NoInput) -> None:
    """What an observable handler does: 100 log lines and 100 progress reports."""
    for step in range(100):
        ctx.log(f"step {step}")
        ctx.report_progress(step + 1, 100, item=f"step {step}")


chatty = define_task(id="bench-chatty", resource_class="io", execute=_chatty)


class Keyed(BaseModel):
    key: str


def _noop_keyed(ctx: TaskContext, params: Keyed) -> Any:
    return None


# The same input, with and without the start policies bench/coalescing.py compares.
plain_keyed = define_task(
    id="bench-keyed-plain", resource_class="io", execute=_noop_keyed, input_model=Keyed
)
debounced = define_task(
    id="bench-keyed-debounced",
    resource_class="io",
    execute=_noop_keyed,
    input_model=Keyed,
    identity_for=lambda params: params.key,
    debounce=Debounce(period_s=3600, max_wait_s=3600),
)
throttled = define_task(
    id="bench-keyed-throttled",
    resource_class="io",
    execute=_noop_keyed,
    input_model=Keyed,
    identity_for=lambda params: params.key,
    throttle=Throttle(period_s=3600),
)
limited = define_task(
    id="bench-keyed-limited",
    resource_class="io",
    execute=_noop_keyed,
    input_model=Keyed,
    concurrency=Concurrency(key=lambda params: params.key, max=1),
)


class FanOut(BaseModel):
    count: int


def _scan(ctx: TaskContext, params: FanOut) -> None:
    ctx.spawn("bench-noop", [{}] * params.count, on_failure="continue")


# A stage that spawns `count` no-op children, and one that waits for them (bench/children.py).
fan_out = define_task(
    id="bench-fan-out",
    resource_class="io",
    input_model=FanOut,
    pipeline=[
        Stage(name="scan", execute=_scan),
        Stage(name="collect", execute=_noop, after=("scan",), await_children=True),
    ],
)
