"""Celery worker subprocesses for the benchmark, and the CPU time each process spends.

Each worker starts on an idle queue of its own, so the benchmark can fill the real queue first
and then open it with `add_consumer`: both sides drain the same kind of backlog from the same
moment. A worker runs in its own process group, and only that group is signalled on stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = Path(tempfile.gettempdir()) / "lumastra-bench"
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Worker:
    process: subprocess.Popen[bytes]
    hostname: str
    idle_queue: str
    log: Path


def _command(
    app_module: str, hostname: str, queue: str, concurrency: int, loglevel: str
) -> list[str]:
    return [
        "-A",
        app_module,
        "worker",
        "--pool=prefork",
        f"--concurrency={concurrency}",
        "-Q",
        queue,
        "-n",
        hostname,
        "--without-mingle",
        "--without-gossip",
        f"--loglevel={loglevel}",
    ]


@contextmanager
def worker(
    control_app: Any,
    app_module: str,
    side: str,
    *,
    concurrency: int,
    loglevel: str,
    profile_to: Path | None = None,
) -> Iterator[Worker]:
    """A `celery worker` subprocess consuming only its idle queue until told otherwise."""
    LOG_DIR.mkdir(exist_ok=True)
    hostname = f"bench-{side}-{os.getpid()}-{time.monotonic_ns()}@localhost"
    idle_queue = f"bench.idle.{side}"
    log_path = LOG_DIR / f"worker-{side}.log"
    args = _command(app_module, hostname, idle_queue, concurrency, loglevel)
    if profile_to is None:
        argv = [sys.executable, "-m", "celery", *args]
    else:
        argv = [sys.executable, str(ROOT / "bench" / "profile_worker.py"), str(profile_to), *args]
    process = spawn(argv, log_path)
    try:
        deadline = time.monotonic() + 60
        while not control_app.control.ping(destination=[hostname], timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {hostname} did not start; see {log_path}")
        yield Worker(process, hostname, idle_queue, log_path)
    finally:
        stop(process)


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """`argv` in a process group of its own (so `stop` reaches its children and nothing
    else), from the project's root, its output in `log_path`."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            env=os.environ.copy(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    # The group is the worker's own (start_new_session), so this reaches its pool children
    # and nothing else; SIGTERM is Celery's warm shutdown.
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def open_queue(control_app: Any, w: Worker, queue: str) -> None:
    replies = control_app.control.add_consumer(queue, destination=[w.hostname], reply=True)
    if not replies:
        raise RuntimeError(f"worker {w.hostname} did not confirm consuming {queue}; see {w.log}")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may contain spaces; fields follow the last ")".
    return raw[raw.rindex(")") + 2 :].split()


def _cpu_seconds(fields: list[str]) -> float:
    # utime and stime are fields 14 and 15 of /proc/<pid>/stat (11 and 12 after the name).
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _reaped_cpu_seconds(fields: list[str]) -> float:
    # cutime and cstime (fields 16 and 17): children that exited and were waited for, such as
    # pool children recycled after max_tasks_per_child, or Postgres backends that closed.
    return (int(fields[13]) + int(fields[14])) / _TICKS


def all_pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far: the worker's main process, its pool children, and the servers."""

    main: float
    children: float
    redis: float  # every redis-server process on the machine
    postgres: float  # every postgres process on the machine
    bench: float  # this process: start_run and apply_async, or polling for the end
    machine: float  # every process on the machine: what other users' load shows up in
    wall: float  # seconds on the monotonic clock, so a difference is the sample's window

    def __sub__(self, other: CpuSample) -> CpuSample:
        return CpuSample(
            self.main - other.main,
            self.children - other.children,
            self.redis - other.redis,
            self.postgres - other.postgres,
            self.bench - other.bench,
            self.machine - other.machine,
            self.wall - other.wall,
        )

    @property
    def others(self) -> float:
        """CPU seconds spent by everything else, i.e. other users of the machine."""
        ours = self.main + self.children + self.redis + self.postgres + self.bench
        return self.machine - ours


def _machine_busy() -> float:
    # First line of /proc/stat: user nice system idle iowait irq softirq steal ... (ticks).
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


def cpu_sample(w: Worker) -> CpuSample:
    main = children = redis = postgres = 0.0
    for pid in all_pids():
        fields = _stat(pid)
        if fields is None:
            continue
        if pid == w.process.pid:
            main = _cpu_seconds(fields)
            children += _reaped_cpu_seconds(fields)
        elif int(fields[1]) == w.process.pid:
            children += _cpu_seconds(fields)
        else:
            name = comm(pid)
            if name.startswith("redis-server"):
                redis += _cpu_seconds(fields) + _reaped_cpu_seconds(fields)
            elif name.startswith("postgres"):
                postgres += _cpu_seconds(fields) + _reaped_cpu_seconds(fields)
    return CpuSample(
        main, children, redis, postgres, time.process_time(), _machine_busy(), time.monotonic()
    )
