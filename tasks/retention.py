"""`Retention`: how long a task's ended runs are kept, instead of the global
`LUMASTRA_HISTORY_RETENTION_S` (Oban's pruner, BullMQ's `removeOnComplete`/`removeOnFail`).

The daily `history-retention` task deletes a task's completed runs that finished more than
`completed_s` ago and its failed and cancelled runs (dead letters and shed or dropped starts
among them) that finished more than `failed_s` ago, except its newest `keep_last` ended runs,
kept whatever their age. A field left None is the global retention. `keep_last` only keeps:
it is a floor, never a cap (BullMQ's `count` is a cap), so a young run is never deleted for
being one too many.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Retention:
    """Seconds after its end that a completed (`completed_s`) or failed or cancelled
    (`failed_s`) run of the task is deleted, None for the global retention; `keep_last`
    newest ended runs are kept whatever their age."""

    completed_s: int | None = None
    failed_s: int | None = None
    keep_last: int | None = None


def _whole(value: object) -> bool:
    # bool is an int subclass; True is not a number of seconds.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def retention_problem(retention: object) -> str | None:
    """What is wrong with a task's `retention=`, None when all is well (`define_task`)."""
    if not isinstance(retention, Retention):
        return "must be Retention(completed_s=, failed_s=, keep_last=)"
    for name in ("completed_s", "failed_s", "keep_last"):
        value = getattr(retention, name)
        if value is not None and not _whole(value):
            return f"{name} must be a whole number >= 0 or None, not {value!r}"
    if retention.completed_s is None and retention.failed_s is None and not retention.keep_last:
        return (
            "sets nothing the global retention does not: give completed_s, failed_s "
            "or keep_last >= 1, or leave retention out"
        )
    return None
