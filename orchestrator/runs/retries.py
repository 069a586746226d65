"""The error document a failure keeps, and the one retry rule: a failed attempt is tried
again, or it ends its run as a dead letter.

`error_doc` builds every error a run or a stage keeps, its message capped; `traceback_tail`
keeps the end of a crash's traceback on it. How a handler's call ended is read by
`runs.execute.outcome_of`.

Plain runs, pipeline stages, and runs or stages whose worker was lost (found by the runner,
the reconciler or a stopping worker's hand-back) all ask `decide`, so one failure reads the
same whichever path met it:

- A **retryable** failure is a `transient` error (or a stage's `limited`), or a lost worker
  (`worker_lost`, `orphaned`) of a task that takes runs back (`retry_on_worker_loss`, the
  default).
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

import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from orchestrator.backoff import jittered_backoff
from tasks.errors import ErrorKind
from tasks.policies import Retry

# A crash's traceback is kept on the error, its last lines only: the frames nearest the raise.
TRACEBACK_MAX_CHARS = 4000


def traceback_tail(exc: BaseException) -> str:
    """The end of `exc`'s formatted traceback, for an error document: operators see where a
    handler crashed without the worker's log."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    return text if len(text) <= TRACEBACK_MAX_CHARS else "…" + text[-TRACEBACK_MAX_CHARS:]


# An error's message is kept to this many characters.
MESSAGE_MAX_CHARS = 4000


def error_doc(kind: ErrorKind, message: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind.value, "message": message[:MESSAGE_MAX_CHARS], **extra}


# What a worker's loss reports: tried again only for a task that takes runs back.
LOST_WORKER = frozenset({ErrorKind.WORKER_LOST, ErrorKind.ORPHANED})
# A stage's `ctx.limit` that waited past its bound is retried as a transient failure (a plain
# run's goes back to pending unspent before this rule: `runs.execute`).
RETRIED = frozenset({ErrorKind.TRANSIENT, ErrorKind.LIMITED})


@dataclass(frozen=True)
class Decision:
    error: dict[str, Any]  # the attempt's error document (`retries.error_doc`)
    delay: timedelta | None  # tried again after this; None: the run (or stage) fails

    @property
    def retries(self) -> bool:
        return self.delay is not None


def retryable(kind: ErrorKind, *, retry_on_worker_loss: bool) -> bool:
    return kind in RETRIED or (kind in LOST_WORKER and retry_on_worker_loss)


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
