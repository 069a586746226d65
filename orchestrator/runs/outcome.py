"""How a handler's call ended, read one way for plain runs and pipeline stages alike.

`outcome_of` makes the call (inside whatever the caller wraps around it: the run's watch) and
turns each way it can end into an `Outcome`: the handler's result; a `TaskError`'s own kind
and message (a cancel is one, `RunCancelled`); the soft time limit, as `timeout`; any other
exception, as `internal`, logged with its traceback, whose tail the error keeps.
Whether a failure is tried again is `runs.retries`' one rule. What each path then writes (a
run's end or put-back, a stage's move) stays with that path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded

from orchestrator.runs.terminal import traceback_tail
from tasks.errors import ErrorKind, TaskError

log = logging.getLogger(__name__)


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
