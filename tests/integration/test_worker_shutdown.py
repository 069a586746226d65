"""The worker role's graceful shutdown, as a deploy or Ctrl+C stops it: `deploy/start-worker.sh`
(one Celery worker per pool and the loops, under `lumastra.workers`) on SIGTERM or SIGINT takes
no new message, gives its running runs LUMASTRA_SHUTDOWN_GRACE_S, hands back the rest
(pending, published again) and ends every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from lumastra.workers import descendants, kill_tree
from orchestrator.models import TaskHistory
from orchestrator.recovery.pending import in_broker_lists
from orchestrator.runs.start import start_run
from orchestrator.stores import live
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import ROOT, database_url, wait_for, worker_process
from tests.support.processes import ONE_PROCESS_PER_POOL, alive, run_commands

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

GRACE_S = 2


@contextmanager
def _worker_role(name: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        **ONE_PROCESS_PER_POOL,
        "DATABASE_URL": database_url(),
        "LUMASTRA_SHUTDOWN_GRACE_S": str(GRACE_S),
        "LUMASTRA_SECRET_KEY": os.environ.get("LUMASTRA_SECRET_KEY", "test-" + "x" * 50),
    }
    log = open(ROOT / f".pytest_cache/role-{name}-{os.getpid()}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [str(ROOT / "deploy/start-worker.sh"), "--without-mingle", "--without-gossip"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        kill_tree(process.pid)
        process.wait()
        log.close()


def _started(process: subprocess.Popen[bytes]) -> list[int]:
    """Waits until every pool's worker has its pool process (a stable tree for 2 s)."""
    seen: list[int] = []
    stable_since = time.monotonic()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, "the worker role exited on its own"
        tree = sorted(descendants(process.pid))
        if tree != seen:
            seen, stable_since = tree, time.monotonic()
        elif len(tree) >= 5 and time.monotonic() - stable_since > 2:
            return tree
        time.sleep(0.2)
    raise TimeoutError(f"the worker role did not settle: {seen}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_worker_role_leaves_no_process_behind(signum: int) -> None:
    with _worker_role(f"stop-{signum}") as role:
        tree = _started(role)

        role.send_signal(signum)
        role.wait(timeout=GRACE_S + 30)

        survivors = [pid for pid in tree if alive(pid)]
        assert survivors == []
        assert role.returncode == 0


def test_a_run_still_running_after_the_grace_is_handed_back() -> None:
    with _worker_role("hand-back") as role:
        _started(role)
        run_id = start_run("test-resumable", {"seconds": 60}, trigger=TriggerKind.MANUAL).run_id
        wait_for(lambda: TaskHistory.objects.get(id=run_id).state == "active", 30)
        began = time.monotonic()

        role.send_signal(signal.SIGTERM)
        role.wait(timeout=GRACE_S + 30)

        assert time.monotonic() - began >= GRACE_S
        row = TaskHistory.objects.get(id=run_id)
        assert (row.state, row.attempts, row.owner_instance_id) == ("pending", 1, "")
        assert row.error["kind"] == "worker_lost"
        assert "handed back after the 2s grace" in row.error["message"]
        # Published again, for another worker.
        assert run_id in in_broker_lists({"task.t.test-resumable"})


def test_a_run_that_ends_within_the_grace_completes() -> None:
    with _worker_role("grace") as role:
        _started(role)
        run_id = start_run("test-resumable", {"seconds": 1}, trigger=TriggerKind.MANUAL).run_id
        # Valkey: a run this short may end before its claim reaches Postgres (`runs.watch`).
        wait_for(lambda: live.read(run_id).get("state") == "active", 30)

        role.send_signal(signal.SIGTERM)
        role.wait(timeout=GRACE_S + 30)

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

        role.send_signal(signal.SIGTERM)
        role.wait(timeout=GRACE_S + 30)

        assert not alive(first)
        row = TaskHistory.objects.get(id=run_id)
        assert (row.state, row.error["kind"]) == ("pending", "worker_lost")

    with worker_process(["task.t.test-command"], concurrency=1, name="after-hand-back"):
        wait_for(lambda: TaskHistory.objects.get(id=run_id).state == "completed", 60)

    pids = run_commands(run_id)
    assert pids[0] == first and len(pids) == 2
    assert not any(alive(pid) for pid in pids)
