"""The worker role's graceful shutdown, as a deploy or Ctrl+C stops it: `deploy/start-worker.sh`
(one Celery worker per pool and the loops, under `lumastra.workers`) on SIGTERM or SIGINT takes
no new message, gives its running runs LUMASTRA_SHUTDOWN_GRACE_S, hands back the rest
(pending, published again), logging one line per run and no traceback, ends every process it
started, and exits 0; idle, within 10 s, whether the signal reaches the role's process alone
(compose, systemd's main-process stop) or its whole process group (honcho under `make run`,
which kills what is left 5 s after the first of its processes stopped)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from lumastra.workers import descendants, kill_tree
from orchestrator.models import TaskHistory
from orchestrator.recovery.pending import in_broker_lists
from orchestrator.runs.start import start_run
from orchestrator.stores import live
from orchestrator.triggers import TriggerKind
from tests.faults.servers import ValkeyServer
from tests.support.fixtures import ROOT, database_url, wait_for, worker_process
from tests.support.processes import ONE_PROCESS_PER_POOL, alive, run_commands

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

GRACE_S = 2
# An idle role stops within this (issue 36); measured 1.3 to 2 s on a loaded 2-core machine.
IDLE_STOP_S = 10
# What a stop must not log: a crash report, or the role giving up on one of its processes.
NOT_IN_A_CLEAN_STOP = ("Traceback", "WorkerLostError", "exited with", "did not stop in time")


@dataclass
class Role:
    process: subprocess.Popen[bytes]
    log: Path

    def signal(self, signum: int, *, group: bool = False) -> int:
        """Sends `signum`, to the role's whole process group with `group` (as honcho does);
        returns where the log stood then."""
        offset = self.log.stat().st_size
        if group:
            os.killpg(self.process.pid, signum)
        else:
            self.process.send_signal(signum)
        return offset

    def log_from(self, offset: int) -> str:
        return self.log.read_bytes()[offset:].decode(errors="replace")


@contextmanager
def _worker_role(name: str, **extra: str) -> Iterator[Role]:
    env = {
        **os.environ,
        **ONE_PROCESS_PER_POOL,
        **extra,
        "DATABASE_URL": database_url(),
        "LUMASTRA_SHUTDOWN_GRACE_S": str(GRACE_S),
        "LUMASTRA_SECRET_KEY": os.environ.get("LUMASTRA_SECRET_KEY", "test-" + "x" * 50),
    }
    path = ROOT / f".pytest_cache/role-{name}-{os.getpid()}.log"
    with path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(ROOT / "deploy/start-worker.sh"),
                "--without-mingle",
                "--without-gossip",
                "--loglevel=INFO",  # each worker says when it is ready
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own, as under honcho
        )
    try:
        yield Role(process, path)
    finally:
        kill_tree(process.pid)
        process.wait()


def _started(role: Role) -> list[int]:
    """Waits until every pool's worker is ready and the loops run; returns the role's tree."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert role.process.poll() is None, f"the worker role exited on its own; see {role.log}"
        text = role.log.read_text(errors="replace")
        pools = text.count("\npool ") + text.startswith("pool ")
        if pools and text.count(" ready.") >= pools and "loops started" in text:
            return descendants(role.process.pid)
        time.sleep(0.2)
    raise TimeoutError(f"the worker role did not get ready; see {role.log}")


def _exit_within(role: Role, timeout: float) -> float:
    """Waits for the role to exit; returns how long that took."""
    began = time.monotonic()
    try:
        role.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        message = f"the worker role still runs {timeout}s after the signal; see {role.log}"
        raise AssertionError(message) from None
    return time.monotonic() - began


@pytest.mark.parametrize(
    ("signum", "group"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["sigterm", "sigint", "sigterm-to-the-group"],
)
def test_an_idle_worker_role_stops_at_once_and_leaves_no_process_behind(
    signum: int, group: bool, tmp_path: Path
) -> None:
    # With the group, every process gets the signal and the role forwards its own close
    # behind: the loops process once deadlocked on that second SIGTERM (45 s, then killed).
    # Idle means idle: a broker of its own, since on the tests' broker its kombu restores what
    # earlier tests' killed workers left unacknowledged, and a pool process may be running one
    # of those when the signal to the group reaches it.
    broker = ValkeyServer(aof=False, log_path=tmp_path / "broker.log")
    broker.start()
    try:
        with _worker_role(f"stop-{signum}-{group}", CELERY_BROKER_URL=broker.url(0)) as role:
            _stops_cleanly(role, signum, group)
    finally:
        broker.stop()


def _stops_cleanly(role: Role, signum: int, group: bool) -> None:
    tree = _started(role)

    offset = role.signal(signum, group=group)
    took = _exit_within(role, IDLE_STOP_S)

    assert role.process.returncode == 0
    assert took < IDLE_STOP_S
    assert [pid for pid in tree if alive(pid)] == []
    said = role.log_from(offset)
    # The group's SIGTERM reaches the idle pool processes too, and billiard's pool finalizer
    # may then print the EOFError of a pipe whose process is gone (seen 1 CI run in 3): a
    # traceback, but no crash report. With the signal to the role alone, nothing at all.
    unclean = NOT_IN_A_CLEAN_STOP
    if group and "_help_stuff_finish" in said:
        unclean = tuple(line for line in unclean if line != "Traceback")
    assert [line for line in unclean if line in said] == []
    assert "loops stopped" in said


def test_a_run_still_running_after_the_grace_is_handed_back() -> None:
    with _worker_role("hand-back") as role:
        _started(role)
        resumable = start_run("test-resumable", {"seconds": 60}, trigger=TriggerKind.MANUAL)
        # Its task takes no run back after a lost worker: handed back, it fails.
        no_resume = start_run("test-no-resume", {"seconds": 60}, trigger=TriggerKind.MANUAL)
        runs = (resumable.run_id, no_resume.run_id)
        wait_for(lambda: TaskHistory.objects.filter(id__in=runs, state="active").count() == 2, 30)

        offset = role.signal(signal.SIGTERM)
        took = _exit_within(role, GRACE_S + 20)

        assert role.process.returncode == 0
        assert GRACE_S <= took < GRACE_S + IDLE_STOP_S
        row = TaskHistory.objects.get(id=resumable.run_id)
        assert (row.state, row.attempts, row.owner_instance_id) == ("pending", 1, "")
        assert row.error["kind"] == "worker_lost"
        assert "handed back after the 2s grace" in row.error["message"]
        # Published again, for another worker.
        assert resumable.run_id in in_broker_lists({"task.t.test-resumable"})
        assert TaskHistory.objects.get(id=no_resume.run_id).state == "failed"
        # The log says so once per run, and reads as a planned stop, not a crash.
        said = role.log_from(offset)
        assert [line for line in NOT_IN_A_CLEAN_STOP if line in said] == []
        for run_id in runs:
            lines = [line for line in said.splitlines() if run_id in line]
            assert len(lines) == 1, lines
            assert "handed back after the 2s grace" in lines[0]
        assert "handed back: 2 pool processes killed, 1 runs put back, 1 failed" in said


def test_a_pool_process_killed_by_anyone_else_is_still_reported_as_a_crash() -> None:
    with _worker_role("crash") as role:
        _started(role)
        run_id = start_run("test-resumable", {"seconds": 60}, trigger=TriggerKind.MANUAL).run_id
        owner = wait_for(lambda: TaskHistory.objects.get(id=run_id).owner_instance_id, 30)
        offset = role.log.stat().st_size

        os.kill(int(owner.split(":")[1]), signal.SIGKILL)  # `host:pid:token`

        said = lambda: role.log_from(offset)  # noqa: E731
        wait_for(lambda: "Traceback" in said() and "WorkerLostError" in said(), 30)
        assert "exited with 'signal 9 (SIGKILL)'" in said()

        role.signal(signal.SIGTERM)  # the role stops as ever, its run handed back if running
        _exit_within(role, GRACE_S + 20)
        assert role.process.returncode == 0


def test_a_run_that_ends_within_the_grace_completes() -> None:
    with _worker_role("grace") as role:
        _started(role)
        run_id = start_run("test-resumable", {"seconds": 1}, trigger=TriggerKind.MANUAL).run_id
        # Valkey: a run this short may end before its claim reaches Postgres (`runs.watch`).
        wait_for(lambda: live.read(run_id).get("state") == "active", 30)

        role.signal(signal.SIGTERM)
        _exit_within(role, GRACE_S + 30)

        row = TaskHistory.objects.get(id=run_id)
        assert (row.state, row.attempts) == ("completed", 1)


@pytest.mark.needs("media")
def test_a_handed_back_run_takes_its_ffmpeg_with_it_and_completes_later() -> None:
    with _worker_role("hand-back-ffmpeg") as role:
        _started(role)
        run_id = start_run(
            "test-command", {"seconds": 6, "program": "ffmpeg"}, trigger=TriggerKind.MANUAL
        ).run_id
        first = wait_for(lambda: run_commands(run_id), 30)[0]
        assert alive(first)

        role.signal(signal.SIGTERM)
        _exit_within(role, GRACE_S + 30)

        assert not alive(first)
        row = TaskHistory.objects.get(id=run_id)
        assert (row.state, row.error["kind"]) == ("pending", "worker_lost")

    with worker_process(["task.t.test-command"], concurrency=1, name="after-hand-back"):
        wait_for(lambda: TaskHistory.objects.get(id=run_id).state == "completed", 60)

    pids = run_commands(run_id)
    assert pids[0] == first and len(pids) == 2
    assert not any(alive(pid) for pid in pids)
