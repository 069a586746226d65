"""A real Celery worker that records which project functions it runs (`tests.support.footprint`).

`python -m tests.support.footprint_worker -A lumastra worker ...` installs the recorder and then
runs Celery's own `celery` command with the arguments given. The recorder goes in before
anything starts a thread: `threading.setprofile` gives it to every thread the process starts
later (Celery's, and the run watch's three threads, which the first run starts), so one
solo-pool process records every thread a run uses. The main thread, where a solo pool runs the
task, gets it when the recording is armed, so the worker's start-up runs unprofiled.

Driven by signals (Celery takes SIGUSR1 and SIGUSR2 for itself):
- `ARM_SIGNAL` forgets what was recorded and starts recording, in every thread, then touches
  `<FOOTPRINT_DIR>/armed`;
- the recording stops by itself, in every thread, at the call of the broker transport's
  `QoS.ack` (`orchestrator.stores.broker`): the acknowledgement of the message, the
  end of a run's path (an `acks_late` task acks after its end has committed);
- `DUMP_SIGNAL` writes what was recorded to `<FOOTPRINT_DIR>/calls.json`, and whether the
  ack ended it.

`recording_worker` (for tests) starts one such worker, solo pool, and waits until it answers a
ping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from tests.support.footprint import ROOT, Calls, Recorder, dump, load
from tests.support.processes import stop

ARM_SIGNAL = signal.SIGRTMIN
DUMP_SIGNAL = signal.SIGRTMIN + 1
DIR_VARIABLE = "FOOTPRINT_DIR"
ARMED = "armed"
CALLS = "calls.json"


def main() -> None:
    from orchestrator.stores.broker import QoS

    out = Path(os.environ[DIR_VARIABLE])
    recorder = Recorder(stop_at=QoS.ack.__code__)
    threading.setprofile(recorder.profile)

    def arm(signum: int, frame: FrameType | None) -> None:
        # Signal handlers run in the main thread: this profiles it from here on.
        recorder.reset()
        sys.setprofile(recorder.profile)
        recorder.armed = True
        (out / ARMED).touch()

    def write(signum: int, frame: FrameType | None) -> None:
        dump(recorder.snapshot(), recorder.stopped, out / CALLS)

    signal.signal(ARM_SIGNAL, arm)
    signal.signal(DUMP_SIGNAL, write)

    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", *sys.argv[1:]]
    celery_main()


class RecordingWorker:
    def __init__(self, process: subprocess.Popen[bytes], out: Path) -> None:
        self.process, self.out = process, out

    def arm(self) -> None:
        """Forget what was recorded and record until the next ack."""
        (self.out / ARMED).unlink(missing_ok=True)
        self.process.send_signal(ARM_SIGNAL)
        self._wait_for(self.out / ARMED)

    def collect(self) -> tuple[Calls, bool]:
        """What the worker recorded since it was armed, and whether an ack ended it."""
        (self.out / CALLS).unlink(missing_ok=True)
        self.process.send_signal(DUMP_SIGNAL)
        self._wait_for(self.out / CALLS)
        return load(self.out / CALLS)

    def _wait_for(self, path: Path, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the recording worker did not write {path.name}")
            time.sleep(0.005)


@contextmanager
def recording_worker(queues: Sequence[str], out: Path) -> Iterator[RecordingWorker]:
    """One recording worker, solo pool, consuming `queues`, as `fixtures.worker_process`
    starts a worker (its arguments from `lumastra.workers.worker_argv`)."""
    from celery import current_app

    from lumastra.workers import worker_argv
    from tests.support.fixtures import database_url

    hostname = f"footprint-{os.getpid()}-{time.monotonic_ns()}@localhost"
    argv = worker_argv(hostname, 1, queues, ["--without-mingle", "--without-gossip", "-l", "INFO"])
    assert argv[1:3] == ["-m", "celery"] and "--pool=prefork" in argv, argv
    argv[2] = __name__
    argv[argv.index("--pool=prefork")] = "--pool=solo"
    env = {**os.environ, "DATABASE_URL": database_url(), DIR_VARIABLE: str(out)}
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)
    log = open(ROOT / f".pytest_cache/worker-footprint-{os.getpid()}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not current_app.control.ping(destination=[hostname], timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {hostname} did not start; see {log.name}")
        yield RecordingWorker(process, out)
    finally:
        stop(process)
        log.close()


if __name__ == "__main__":
    main()
