"""The tasks the benchmarks run through Lumastra (loaded via LUMASTRA_TASK_MODULES).

They do nothing, so what a benchmark measures is the engine around them: start_run, the
broker, the worker pool and the runner's reads and writes; for `bench-pipe4`, a pipeline's
stage claims, ends and advances (bench/pipeline.py); for `bench-chatty`, the live log and
progress (bench/observability.py).
"""

from __future__ import annotations

from tasks import NoInput, Stage, TaskContext, define_task


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
