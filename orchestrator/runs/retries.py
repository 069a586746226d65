"""The one retry rule: a failed attempt is tried again, or it ends its run as a dead letter.

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

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from orchestrator.backoff import jittered_backoff
from orchestrator.runs.terminal import MESSAGE_MAX_CHARS, error_doc
from tasks.errors import ErrorKind
from tasks.policies import Retry

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
