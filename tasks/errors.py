"""The errors a task raises to tell the engine what went wrong, and the kinds they map to."""

from __future__ import annotations

from enum import Enum


class ErrorKind(Enum):
    TRANSIENT = "transient"  # may succeed if tried again later (network blip, lock held)
    PERMANENT = "permanent"  # will fail the same way every time; never retried
    FATAL = "fatal"  # fails the run and counts toward the task's circuit breaker
    VALIDATION = "validation"  # input did not match the task's input model
    CANCELLED = "cancelled"  # the handler stopped because the run was cancelled
    TIMEOUT = "timeout"  # the handler passed its soft timeout
    STALE_VERSION = "stale_version"  # message enqueued for an older processing_version
    INTERNAL = "internal"  # an unexpected exception escaped the handler
    DROPPED = "dropped"  # refused at a full queue (backpressure `drop`); never enqueued
    ORPHANED = "orphaned"  # its worker stopped heartbeating; failed by the reconciler
    SHED = "shed"  # removed from a full queue to make room (backpressure `shed-oldest`)
    STALLED = "stalled"  # no progress for its stall limit (LUMASTRA_STALL_FAIL_S_<CLASS>)
    WORKER_LOST = "worker_lost"  # its worker died mid-run, or its message kept coming back
    WINDOW_CLOSED = "window_closed"  # stopped as its run window closed; put back, not failed
    LIMITED = "limited"  # `ctx.limit` waited past its limit's wait_s; put back, not failed
    CHILD_FAILED = "child_failed"  # a child spawned with on_failure="fail_parent" did not complete


class TaskError(Exception):
    """Base of the errors a task handler raises on purpose."""

    kind: ErrorKind = ErrorKind.INTERNAL


class TransientError(TaskError):
    kind = ErrorKind.TRANSIENT


class PermanentError(TaskError):
    kind = ErrorKind.PERMANENT


class FatalError(TaskError):
    kind = ErrorKind.FATAL


class LimitReached(TaskError):
    """Raised by `TaskContext.limit` when the limit has no room within its `wait_s`: the run
    goes back to pending until it may have, its attempt not spent (a pipeline stage: retried as
    a transient failure)."""

    kind = ErrorKind.LIMITED


class RunCancelled(TaskError):
    """Raised by `TaskContext.raise_if_cancelled()`; the engine records the run as cancelled."""

    kind = ErrorKind.CANCELLED


class ManifestError(ValueError):
    """A task (or trigger: `what="trigger"`) definition is malformed; names it and the
    offending field."""

    def __init__(self, task_id: str, field: str, problem: str, *, what: str = "task") -> None:
        super().__init__(f"{what} {task_id!r}, field {field!r}: {problem}")
        self.task_id = task_id
        self.field = field
        self.problem = problem


class ProcessFailed(TaskError):
    """Raised by `TaskContext.run_process` when the command exits non-zero or is killed by a
    signal. Its `kind` is the one the task chose for the failure (transient by default: tried
    again; permanent for input the command can never take, such as a corrupt file)."""

    def __init__(
        self, message: str, *, kind: ErrorKind, exit_code: int, tail: tuple[str, ...]
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code
        self.tail = tail
