"""Processes a run's command left behind: found by the marks in their environment and killed.

Every command `ctx.run_process` starts carries its run, the pool process that started it and
a token of its own in its environment (`RUN_MARK`, `OWNER_MARK`, `COMMAND_MARK`), and
whatever it forks inherits them, also a
process that left the command's process group (`setsid`) or dropped its parent-death signal,
which the group kill and the death signal miss. Two sweeps find them by reading
`/proc/<pid>/environ`:

- when a command ends, however it ended, the pool process kills what is still marked with
  that command's token (`kill_left_by`);
- on every worker host, the worker role sweeps once as it starts (a host SIGKILLed whole and
  started again) and its loops process every LUMASTRA_RECONCILE_INTERVAL_S: a marked process
  whose owner is gone from this host is killed (`sweep`). Each kill is logged with its run,
  pid, owner and command line.

Not guaranteed: a process that cleared its environment, or runs as another user (its environ
is unreadable), is not found; an owner pid reused by an unrelated process keeps its leftovers
alive until that process ends (the safe way to be wrong).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from orchestrator.cluster.instance import instance_id, is_dead_here

log = logging.getLogger(__name__)

RUN_MARK = "LUMASTRA_RUN_ID"
OWNER_MARK = "LUMASTRA_RUN_OWNER"
COMMAND_MARK = "LUMASTRA_RUN_COMMAND"
PROC = Path("/proc")


@dataclass(frozen=True)
class Marked:
    pid: int
    run_id: str
    owner: str
    token: str
    command: str  # its command line, for the log


def marks(run_id: str) -> dict[str, str]:
    """The environment entries that mark one command of `run_id` started by this process."""
    return {RUN_MARK: run_id, OWNER_MARK: instance_id(), COMMAND_MARK: secrets.token_hex(8)}


def marked() -> Iterator[Marked]:
    """Every process on this host with a run's marks that this process may read."""
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").strip()
        except OSError:  # gone meanwhile, or another user's
            continue
        found = dict(item.decode(errors="replace").partition("=")[::2] for item in environ)
        if RUN_MARK in found and OWNER_MARK in found:
            yield Marked(
                pid=int(entry.name),
                run_id=found[RUN_MARK],
                owner=found[OWNER_MARK],
                token=found.get(COMMAND_MARK, ""),
                command=command.decode(errors="replace"),
            )


def _kill(process: Marked, why: str) -> None:
    log.warning(
        "killed pid %s (%s) of run %s, started by %s: %s",
        process.pid,
        process.command[:200],
        process.run_id,
        process.owner,
        why,
    )
    with suppress(ProcessLookupError, PermissionError):
        os.kill(process.pid, signal.SIGKILL)


def kill_left_by(command_marks: dict[str, str]) -> list[Marked]:
    """Kill what the command `command_marks` marked left running after it ended."""
    left = [p for p in marked() if p.token == command_marks[COMMAND_MARK]]
    for process in left:
        _kill(process, "left running after its command ended")
    return left


def sweep() -> list[Marked]:
    """Kill every marked process whose owner process is gone from this host."""
    left = [p for p in marked() if is_dead_here(p.owner)]
    for process in left:
        _kill(process, "its pool process is gone")
    return left
