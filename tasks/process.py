"""What `TaskContext.run_process` returns: a finished command's exit and the end of its output."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessResult:
    argv: tuple[str, ...]
    exit_code: int  # 0: `run_process` raises `ProcessFailed` for any other
    tail: tuple[str, ...]  # its last output lines (stdout and stderr in arrival order), bounded
    cpu_seconds: float  # user + system CPU of the command, charged to the run as `cpu_seconds`
    wall_seconds: float
