"""Processes the tests start and look for: alive or gone, and a light worker role."""

from __future__ import annotations

import re
import subprocess

# One process per pool keeps a whole worker role light on a shared machine.
ONE_PROCESS_PER_POOL = {
    f"LUMASTRA_CONCURRENCY_{c}": "1"
    for c in ("CPU", "IO", "INGEST", "EMBEDDING", "MAINTENANCE", "BULK", "ANALYSIS", "DISCOVERY")
}


def stop(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout` seconds; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (ended, not yet reaped by its parent) does not."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_STARTED = re.compile(r"^started \S+ \(pid (\d+)\)$")


def run_commands(run_id: str) -> list[int]:
    """The pids of the commands a run's attempts started (`ctx.run_process`), as it logged
    them."""
    from orchestrator.runs import context

    found = (_STARTED.match(str(line.entry.get("msg", ""))) for line in context.read_log(run_id))
    return [int(match.group(1)) for match in found if match]
