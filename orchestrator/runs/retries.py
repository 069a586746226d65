"""How a handler's call ended, and the one retry rule: a failed attempt is tried again, or it
ends its run as a dead letter.

`outcome_of` makes the call (inside whatever the caller wraps around it: the run's watch) and
turns each way it can end into an `Outcome`, read one way for plain runs and pipeline stages
alike: the handler's result; a `TaskError`'s own kind and message (a cancel is one,
`RunCancelled`); the soft time limit, as `timeout`; any other exception, as `internal`, logged
with its traceback, whose tail the error keeps. What each path then writes (a run's end or
put-back, a stage's move) stays with that path.

Plain runs, pipeline stages, and runs or stages whose worker was lost (found by the runner,
the reconciler or a stopping worker's hand-back) all ask `decide`, so one failure reads the
same whichever path met it:

- A **retryable** failure is a `transient` error, or a lost worker (`worker_lost`,
  `orphaned`) of a task that takes runs back (`retry_on_worker_loss`, the default).
- While attempts are left (`Retry.max_attempts` counts every attempt, whatever ended it), it
  is tried again after the policy's jittered backoff; its error says the attempt and the wait.
- On the last attempt it fails **exhausted**: its error says so and carries
  `exhausted: true`, which makes the run a dead letter (the Dead letters page,
  `GET /dead-letters`, `runs.rerun.dead_letters`). A stage's exhausted error becomes its
  run's.
- Any other failure (permanent, fatal, validation, timeout, ...) fails at once, never a
  dead letter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded

from orchestrator.backoff import jittered_backoff
from orchestrator.runs.terminal import MESSAGE_MAX_CHARS, error_doc, traceback_tail
from tasks.errors import ErrorKind, TaskError
from tasks.policies import Retry

log = logging.getLogger(__name__)

# What a worker's loss reports: tried again only for a task that takes runs back.
LOST_WORKER = frozenset({ErrorKind.WORKER_LOST, ErrorKind.ORPHANED})


@dataclass(frozen=True)
class Decision:
    error: dict[str, Any]  # the attempt's error document (`terminal.error_doc`)
    delay: timedelta | None  # tried again after this; None: the run (or stage) fails

    @property
    def retries(self) -> bool:
        return self.delay is not None


def retryable(kind: ErrorKind, *, retry_on_worker_loss: bool) -> bool:
    return kind is ErrorKind.TRANSIENT or (kind in LOST_WORKER and retry_on_worker_loss)


def may_retry(kind: ErrorKind, attempt: int, policy: Retry, *, retry_on_worker_loss: bool) -> bool:
    """Whether attempt number `attempt`, failed with `kind`, is tried again."""
    retries = retryable(kind, retry_on_worker_loss=retry_on_worker_loss)
    return retries and attempt < policy.max_attempts


def decide(
    kind: ErrorKind,
    message: str,
    attempt: int,
    policy: Retry,
    /,
    *,
    retry_on_worker_loss: bool,
    **extra: Any,
) -> Decision:
    """Attempt number `attempt` failed with `kind` and `message`: tried again (when, and
    the error it keeps meanwhile), or failed with its final error. `extra` joins the error
    document (a stage's name, a lost owner, a traceback)."""
    if may_retry(kind, attempt, policy, retry_on_worker_loss=retry_on_worker_loss):
        delay = jittered_backoff(policy, attempt)
        note = (
            f"attempt {attempt} of {policy.max_attempts}; retrying in {delay.total_seconds():.1f}s"
        )
        return Decision(error_doc(kind, _noted(message, note), **extra), delay)
    if retryable(kind, retry_on_worker_loss=retry_on_worker_loss):
        note = f"attempts exhausted: {attempt} of {policy.max_attempts}"
        return Decision(error_doc(kind, _noted(message, note), exhausted=True, **extra), None)
    return Decision(error_doc(kind, message, **extra), None)


def _noted(message: str, note: str) -> str:
    """The message with the rule's note, which a long message's cap must not cut off."""
    return f"{message[: MESSAGE_MAX_CHARS - len(note) - 3]} ({note})"


@dataclass(frozen=True)
class Outcome:
    result: Any = None
    kind: ErrorKind | None = None  # None: the call returned `result`
    message: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # an internal error's traceback


def outcome_of(call: Callable[[], Any], *, soft_timeout: timedelta, what: str) -> Outcome:
    """Make the handler's `call`; `what` names it in the log ("run <id>: handler")."""
    try:
        return Outcome(result=call())
    except TaskError as exc:
        return Outcome(kind=exc.kind, message=str(exc))
    except SoftTimeLimitExceeded:
        return Outcome(kind=ErrorKind.TIMEOUT, message=f"passed its soft timeout of {soft_timeout}")
    except Exception as exc:
        log.exception("%s raised", what)
        return Outcome(
            kind=ErrorKind.INTERNAL,
            message=f"{type(exc).__name__}: {exc}",
            extra={"traceback": traceback_tail(exc)},
        )
