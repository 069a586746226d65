"""What a task handler sees of its run. The engine implements this protocol."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tasks.errors import ErrorKind
from tasks.process import ProcessResult


@dataclass(frozen=True)
class ChildRun:
    """A child run as its parent sees it (`ctx.children`)."""

    run_id: str
    task_id: str
    input: dict[str, Any]  # as it was spawned: matches a result to the work it was given
    state: str  # pending, active, cancelling, completed, failed or cancelled
    result: Any  # its result once completed; None when over the stage result cap
    error: dict[str, Any] | None
    result_omitted: bool = False  # its result is over LUMASTRA_STAGE_RESULT_MAX_BYTES


class TaskContext(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def input(self) -> Any:
        """The validated input (an instance of the task's input model)."""
        ...

    @property
    def results(self) -> Mapping[str, Any]:
        """In a pipeline stage: what the stages that completed before it returned, by stage
        name (a skipped stage has none). Empty outside pipelines."""
        ...

    def log(self, message: str) -> None:
        """Append a line to the run's live log."""
        ...

    def warn(self, message: str) -> None:
        """Record a warning on the current step: a step that succeeds with warnings ends
        `warning`, not `ok`."""
        ...

    def count(self, name: str, n: int = 1) -> None:
        """Add `n` to one of the current step's counters (e.g. `cache_read_tokens`)."""
        ...

    def spend(self, kind: str, units: float) -> None:
        """Record usage of a costed resource (e.g. `("openai_tokens", 1200)`) on the current
        step, on the run's `cost_breakdown` and on the task's daily spend (cost quotas)."""
        ...

    def report_progress(
        self, done: float, total: float | None = None, item: str | None = None
    ) -> None:
        """Report progress as `done` of `total` (or a fraction in 0..1 when total is None),
        optionally naming the `item` being worked on. Cheap to call in a tight loop: reports
        are coalesced (the run shows the latest, with a rate and an ETA)."""
        ...

    @property
    def cancelled(self) -> bool:
        """True once the run has been asked to cancel."""
        ...

    def raise_if_cancelled(self) -> None:
        """Raise `RunCancelled` if the run has been asked to cancel."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, raising `RunCancelled` at once if the run is cancelled meanwhile."""
        ...

    def spawn(
        self,
        task_id: str,
        inputs: Sequence[Mapping[str, Any]],
        *,
        on_failure: Literal["fail_parent", "continue"] = "fail_parent",
        priority: int | None = None,
    ) -> list[str]:
        """Start child runs of `task_id`, one per input (at most 10,000 per step), and return
        their run ids. They are written with this step's end, so a step that fails or is tried
        again starts none; a bad input fails the step, naming its index and field. Children
        take this run's priority unless `priority` is given. A later stage declared with
        `await_children=True` waits until every child of its dependencies has ended; with
        `on_failure="fail_parent"` the first child that does not complete fails this run while
        it is still running (a pipeline awaiting them; a plain run has ended by then) and
        cancels the others; with `"continue"` the awaiting stage sees the failures."""
        ...

    def children(self, stage: str) -> list[ChildRun]:
        """The children `stage` of this run spawned, in the order spawned (after a resume, the
        kept ones first): each one's id, input, state, result and error."""
        ...

    def limit(self, limit_id: str, units: int = 1) -> AbstractContextManager[None]:
        """`with ctx.limit("tmdb"):` takes `units` of a named limit (`tasks.limits`) for the
        block, under the key of this run's input, waiting its turn up to the limit's `wait_s`;
        past it, raises `LimitReached` and the run goes back to pending for when the limit has
        room, its attempt not spent. A rate's units stay spent; a concurrency's are given back
        when the block ends."""
        ...

    def run_process(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        on_stdout: Callable[[str], None] | None = None,
        fails_as: ErrorKind | Callable[[ProcessResult], ErrorKind] = ErrorKind.TRANSIENT,
        grace_s: float = 5.0,
    ) -> ProcessResult:
        """Run a command to its end, never through a shell, in `cwd` (an existing directory)
        with only `env` as its environment (default: PATH alone) and the run's marks
        (`LUMASTRA_RUN_*`, which find whatever it leaves behind). It runs in a process group
        of its own that dies with the run: a cancel (raising `RunCancelled`), an exception in
        the handler or in `on_stdout`, a timeout, and any end of the run stop the whole group,
        SIGTERM then SIGKILL after `grace_s`; if the pool process itself dies, the kernel sends
        the command SIGKILL (its parent-death signal). Each stdout line goes to `on_stdout`
        when given (e.g. to parse `ffmpeg -progress pipe:1` into `report_progress`), else to
        the run's log; stderr lines go to the log. Every line counts as a sign of life for the
        stall watchdog. The command's CPU time is charged with `spend("cpu_seconds", …)`. A
        non-zero exit raises `ProcessFailed` with the kind `fails_as` gives and its last lines
        of output in the message."""
        ...
