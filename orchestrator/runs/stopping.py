"""A Celery worker of the worker role as the role stops: a planned kill is not a crash, and
a worker done with its shutdown ends promptly.

The worker role (`lumastra.workers`) stops its Celery workers with SIGTERM (Celery's warm
shutdown) and, once LUMASTRA_SHUTDOWN_GRACE_S is over, kills the pool processes still running
and hands their runs back (`runs.handback`), logging one line per run. Celery would also log
each of those kills as a crash: "Process 'ForkPoolWorker-1' pid:… exited with 'signal 9
(SIGKILL)'" from billiard, then "Task handler raised error: WorkerLostError(…)" with a
traceback. Here:

- Before each kill, `hand_back` marks the process (`mark`): an empty file named by its pid in
  a directory the role makes for this purpose and names to its workers in MARKS.
- `Request` (every task's request class, `runs.celery_tasks`) gives a marked process's
  message back to its queue without the error and its traceback, as Celery does for any lost
  worker (`reject_on_worker_lost`); the copy that comes back finds its run pending, or claimed
  anew, and is dropped or waits its turn, as any duplicate.
- `QuietPlannedKills` (on billiard's logger, installed by `on_worker_init`) drops the
  "exited with" line of a marked process.
A pool process that dies any other way (the OOM killer, a crash, a kill by anyone else, the
run's own watchdog) is not marked and is logged exactly as before, whenever it happens.

`on_worker_shutdown`: once Celery's warm shutdown is complete (no message taken, every run
ended or handed back, the pool's processes joined, the broker connection closed), the
process has nothing left to do but exit; yet Python's exit walks the whole heap (Django, the
registry, Celery, kombu) with its garbage collector, more than once, and the role's five
workers do it at once. On a 2-core machine an idle role's SIGTERM-to-exit took 2.6 to 3.5 s,
4 to 9 s while other work loaded the machine; honcho (`make run`) kills what is left 5 s
after the first of its processes stopped. Frozen (`gc.freeze`), the heap is left out of
those collections (1.8 to 2 s, 2 to 3 s loaded); exit hooks, log flushes and connection
closes all still run.

Not guaranteed: a process killed by someone else at the very moment the hand back kills it
is logged as a planned kill (it was about to be killed anyway).
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

from billiard.exceptions import WorkerLostError
from celery.worker.request import Request as CeleryRequest

log = logging.getLogger(__name__)

# The directory of the marks; set by the worker role for its Celery workers.
MARKS = "LUMASTRA_HANDBACK_MARKS"
# billiard's line for a pool process that exited other than by itself (`Pool._join_exited_workers`).
_EXITED = "Process %r pid:%r exited with %r"


def mark(marks: Path, pid: int) -> None:
    """Marks `pid` as killed by the hand back, before it is."""
    try:
        (marks / str(pid)).touch()
    except OSError as exc:
        log.warning("pool process %s not marked (%s): its kill will read as a crash", pid, exc)


def handed_back(pid: object) -> bool:
    """Whether the pool process `pid` of this worker was killed by the role's hand back."""
    marks = os.environ.get(MARKS)
    if not marks or pid is None:
        return False
    return (Path(marks) / str(pid)).exists()


class Request(CeleryRequest):
    """Celery's request; the message of a process the hand back killed goes back to its
    queue without the error Celery would log for a lost worker (see the module docstring)."""

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        # billiard wraps the exception it sends across processes (`ExceptionWithTraceback`).
        exc = getattr(exc_info.exception, "exc", exc_info.exception)
        if isinstance(exc, WorkerLostError) and handed_back(self.worker_pid):
            super().on_failure(exc_info, send_failed_event=False, return_ok=True)
            return
        super().on_failure(exc_info, send_failed_event, return_ok)


class QuietPlannedKills(logging.Filter):
    """Drops billiard's "exited with" line for a process the hand back killed."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        planned = (
            record.msg == _EXITED
            and isinstance(args, tuple)
            and len(args) == 3
            and handed_back(args[1])
        )
        return not planned


def on_worker_init(**_: Any) -> None:
    """Celery's worker_init, in a worker's main process: under the worker role (MARKS set),
    its planned kills are not logged as crashes."""
    if os.environ.get(MARKS):
        logging.getLogger("multiprocessing").addFilter(QuietPlannedKills())


def on_worker_shutdown(**_: Any) -> None:
    """Celery's worker_shutdown, once a worker's shutdown is complete: its heap is frozen, so
    the interpreter's exit does not walk it (see the module docstring)."""
    gc.freeze()
