"""What a task handler sees of its run. The engine implements this protocol."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


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
