"""The operator CLI's exit codes, and the one exception a sub-command raises to leave with one.

Few and stable: scripts test them. argparse's own usage errors exit 2 as well, so a script
tells "I called it wrong" from every other outcome without reading stderr.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError

from orchestrator.api.errors import ApiError

OK = 0  # done
NOT_COMPLETED = 1  # `watch`: the run ended failed or cancelled, or --timeout passed first
USAGE = 2  # a malformed argument: run id, --input pair, --since, a value the API refuses (422)
NOT_FOUND = 3  # no such run or task
REFUSED = 4  # no acting user, an unknown or inactive one, or one without the permission
NOT_NOW = 5  # the run's or task's state does not allow it (not cancellable, already paused, ...)
INTERRUPTED = 130  # `watch` stopped by Ctrl-C (the shell's code for SIGINT); the run goes on

TABLE = """exit codes:
  0    done
  1    watch: the run ended failed or cancelled, or --timeout passed first
  2    usage: a malformed argument (run id, --input pair, --since, a bad value)
  3    not found: no such run or task
  4    refused: no acting user (--as, LUMASTRA_CLI_USER), an unknown or inactive
       one, or one without the permission the API would require
  5    not now: the state does not allow it (not cancellable, not retryable,
       already paused, not paused, a dead letter refused)
  130  watch: interrupted (Ctrl-C); the run goes on"""


class Failure(Exception):
    """Leave with `code`, `message` on stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _code(status: int) -> int:
    if status == 404:
        return NOT_FOUND
    if status in (400, 422):
        return USAGE
    if status in (401, 403):
        return REFUSED
    return NOT_NOW  # 409, and admission's 429 and 503: refused by the state things are in


@contextmanager
def api_errors() -> Iterator[None]:
    """An API operation's error answer (and a schema's refusal of a value) as the CLI's exit."""
    try:
        yield
    except ApiError as exc:
        raise Failure(_code(exc.status), exc.detail) from None
    except ValidationError as exc:
        said = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
        raise Failure(USAGE, said) from None
