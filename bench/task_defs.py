"""The task the benchmark runs through Lumastra (loaded via LUMASTRA_TASK_MODULES).

It does nothing, so what the benchmark measures is the engine around it: start_run, the broker,
the worker pool and the runner's reads and writes.
"""

from __future__ import annotations

from tasks import NoInput, TaskContext, define_task


def _noop(ctx: TaskContext, params: NoInput) -> None:
    return None


noop = define_task(id="bench-noop", resource_class="io", execute=_noop)
