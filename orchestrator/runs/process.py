"""`TaskContext.run_process`: a handler's command, run so that nothing it starts outlives the run.

Celery users lose subprocesses to every way a task ends early: a hard time limit or a dead
pool child leaves its ffmpeg running, re-parented to init (celery/celery#2353). Here:
- the command runs in a session and process group of its own (`start_new_session`), so the
  whole group is signalled, whatever the command forked;
- `setpriv --pdeathsig KILL` sets its parent-death signal before it execs the command: if the
  pool child is killed (a watchdog, kill now, the OOM killer, SIGKILL of the worker), the
  kernel kills the command. setpriv (util-linux) is used instead of a `preexec_fn` because the
  pool child runs the watch threads, and Python code between fork and exec can deadlock on a
  lock another thread held at the fork;
- the handler's thread reads the output and checks for a cancel at least every POLL_S: a
  cancel, an exception (the soft time limit, `on_stdout` raising) or the read ending stops the
  group, SIGTERM and then SIGKILL after the grace, and whatever the leader left behind in its
  group is killed when it exits.

A command that makes a new session of its own (`setsid`) leaves the group and is not
signalled with it, and a setuid binary drops its parent-death signal: the marks every command
carries in its environment find such a process when the command ends and, if its pool process
died first, at the worker host's next sweep (`runs.leftovers`).

Not guaranteed: a process that clears its environment and leaves the group is not found.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import IO, Protocol

from orchestrator import tracing
from orchestrator.runs import leftovers
from tasks.errors import ErrorKind, PermanentError, ProcessFailed
from tasks.process import ProcessResult

log = logging.getLogger(__name__)


class RunLog(Protocol):
    """What the output loop needs of `runs.context.RunLog`."""

    def write(self, level: str, message: str) -> None: ...


class RunContext(Protocol):
    """What the output loop needs of `runs.context.RunContext` (which imports this module)."""

    progressed_at: float  # read by the stall watchdog

    @property
    def run_id(self) -> str: ...
    @property
    def run_log(self) -> RunLog: ...
    def raise_if_cancelled(self) -> None: ...
    def spend(self, kind: str, units: float) -> None: ...


# How often the output loop looks for a cancel when the command is silent.
POLL_S = 0.2
TAIL_LINES = 40
MAX_LINE = 2000  # characters of one line kept (a progress bar without newlines is one line)
# Lines logged per command; after that only the tail is kept (a chatty command must not fill
# the run's log buffer with one attempt).
MAX_LOGGED_LINES = 5000
# How long output is still read once the command has exited: a process it forked may hold its
# pipes open (a daemon, a grandchild that left the group); that one is killed, not waited for.
LINGER_S = 1.0
SETPRIV = "setpriv"


def run(
    ctx: RunContext,
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None,
    on_stdout: Callable[[str], None] | None,
    fails_as: ErrorKind | Callable[[ProcessResult], ErrorKind],
    grace_s: float,
) -> ProcessResult:
    command = _checked_argv(argv)
    folder = Path(cwd)
    if not folder.is_dir():
        raise ValueError(f"run_process: cwd {str(folder)!r} is not a directory")
    if grace_s < 0:
        raise ValueError("run_process: grace_s must be >= 0")
    environment = dict(env) if env is not None else {"PATH": os.environ.get("PATH", os.defpath)}
    if shutil.which(command[0], path=environment.get("PATH", os.defpath)) is None:
        # Installing it is the fix; trying again before that is not.
        raise PermanentError(
            f"run_process: {command[0]!r} is not installed (not found on PATH "
            f"{environment.get('PATH', os.defpath)!r})"
        )
    with (
        tracing.span("lumastra.process", {"process.command": command[0]})
        if tracing.ON
        else tracing.OFF
    ):
        # Inherited by everything the command forks: what escapes its group is still found.
        command_marks = leftovers.marks(ctx.run_id)
        environment |= command_marks
        began = time.monotonic()
        before = os.times()
        # argv is the task author's, run without a shell.
        process = subprocess.Popen(  # noqa: S603
            [_setpriv(), "--pdeathsig", "KILL", "--", *command],
            cwd=folder,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        ctx.run_log.write("info", f"started {command[0]} (pid {process.pid})")
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        try:
            _follow(ctx, process, tail, on_stdout)
            exit_code = _wait(ctx, process)
        except BaseException:
            _stop(process, grace_s)
            raise
        finally:
            # What the leader left behind in its group goes with it, and what left the group.
            _kill_group(process.pid)
            leftovers.kill_left_by(command_marks)
            # Charged however the command ended: a cancelled or timed-out encode used the CPU too.
            cpu_seconds = _children_cpu_since(before)
            if cpu_seconds > 0:
                ctx.spend("cpu_seconds", cpu_seconds)
        result = ProcessResult(
            argv=tuple(command),
            exit_code=exit_code,
            tail=tuple(tail),
            cpu_seconds=cpu_seconds,
            wall_seconds=round(time.monotonic() - began, 3),
        )
        # How long the command itself took, beside the run's own times (bench/media.py reads it).
        ctx.run_log.write(
            "info",
            f"{command[0]} exited with {result.exit_code} after {result.wall_seconds:.3f} s "
            f"({result.cpu_seconds:.3f} CPU s)",
        )
        if tracing.ON:
            tracing.annotate({"process.exit_code": result.exit_code})
        if result.exit_code != 0:
            kind = fails_as(result) if callable(fails_as) else fails_as
            raise ProcessFailed(
                _failure_message(result), kind=kind, exit_code=result.exit_code, tail=result.tail
            )
        return result


def _children_cpu_since(before: os.times_result) -> float:
    # The children's times count a process once it was waited for: the leader has been, on
    # every path here (`_wait` or `_stop`).
    after = os.times()
    return round(
        (after.children_user - before.children_user)
        + (after.children_system - before.children_system),
        3,
    )


def _checked_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str | bytes) or not argv:
        raise ValueError("run_process: argv must be a non-empty list of strings (no shell)")
    if not all(isinstance(part, str) for part in argv):
        raise ValueError("run_process: every part of argv must be a string")
    return list(argv)


def _setpriv() -> str:
    found = shutil.which(SETPRIV)
    if found is None:
        raise RuntimeError(
            "run_process needs `setpriv` (Debian's util-linux) to give the command its "
            "parent-death signal"
        )
    return found


def _follow(
    ctx: RunContext,
    process: subprocess.Popen[bytes],
    tail: deque[str],
    on_stdout: Callable[[str], None] | None,
) -> None:
    """Read both pipes to their end, a line at a time, checking for a cancel meanwhile; once
    the command has exited, only until they fall silent or LINGER_S has passed."""
    assert process.stdout is not None and process.stderr is not None
    logged = 0
    pending = {process.stdout: b"", process.stderr: b""}
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for each in pending:
            os.set_blocking(each.fileno(), False)
            selector.register(each, selectors.EVENT_READ)
        while selector.get_map():
            ctx.raise_if_cancelled()
            # Noticed before the select: a silent round after the exit saw all it wrote.
            if exited_at is None and process.poll() is not None:
                exited_at = time.monotonic()
            ready = selector.select(POLL_S)
            if exited_at is not None and (not ready or time.monotonic() - exited_at > LINGER_S):
                return
            for key, _ in ready:
                pipe: IO[bytes] = key.fileobj  # type: ignore[assignment]
                chunk = os.read(pipe.fileno(), 65536)
                if not chunk:
                    selector.unregister(pipe)
                    lines = [pending.pop(pipe)] if pending[pipe] else []
                else:
                    *lines, pending[pipe] = (pending[pipe] + chunk).split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").rstrip("\r")[:MAX_LINE]
                    # Output is a sign of life for the stall watchdog, logged or not.
                    ctx.progressed_at = time.monotonic()
                    tail.append(line)
                    if pipe is process.stdout and on_stdout is not None:
                        on_stdout(line)
                    elif logged < MAX_LOGGED_LINES:
                        logged += 1
                        ctx.run_log.write("info", line)


def _stop(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the group, SIGKILL once the grace has passed without its leader exiting."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        log.warning("pid %s: still running %.1fs after SIGTERM; killing", process.pid, grace_s)
    _kill_group(process.pid)
    process.wait()


def _kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _wait(ctx: RunContext, process: subprocess.Popen[bytes]) -> int:
    """The leader's exit, once its output has ended (it may still be writing files)."""
    while True:
        try:
            return process.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        ctx.raise_if_cancelled()


def _failure_message(result: ProcessResult) -> str:
    name = Path(result.argv[0]).name
    if result.exit_code < 0:
        how = f"was killed by {signal.Signals(-result.exit_code).name}"
    else:
        how = f"exited with {result.exit_code}"
    last = "\n".join(result.tail[-10:])
    return f"{name} {how}" + (f":\n{last}" if last else "")
