"""A run whose work is a command (`ctx.run_process`, issue 23) on a real worker: every way the
run ends takes the command with it — a cancel, kill now, the hard timeout, its pool child
SIGKILLed — and the run ends as each path promises."""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator.models import TaskHistory
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.task_defs import COMMAND_PIDS_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

QUEUES = ["task.t.test-command", "task.t.test-command-timeout"]
FAST = {"LUMASTRA_HEARTBEAT_INTERVAL_S": "1", "LUMASTRA_CANCEL_ESCALATE_S": "3"}


def _state(run_id: str) -> str:
    return str(TaskHistory.objects.values_list("state", flat=True).get(id=run_id))


def _commands(run_id: str) -> list[int]:
    """The pids of the commands the run's attempts started, as they printed them."""
    return [int(p) for p in valkey.client().lrange(f"{COMMAND_PIDS_KEY}:{run_id}", 0, -1)]


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: state, parent pid, …"""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    try:
        return _stat(pid)[0] != "Z"
    except FileNotFoundError:
        return False


def _started(task: str, seconds: float, **extra: object) -> tuple[str, int]:
    run_id = start_run(task, {"seconds": seconds, **extra}, trigger=TriggerKind.MANUAL).run_id
    pid = wait_for(lambda: _commands(run_id), timeout=30)[0]
    assert _alive(pid)
    return run_id, pid


@pytest.mark.parametrize("kill", [False, True], ids=["cancel", "kill-now"])
def test_a_cancelled_run_takes_its_command_with_it(kill: bool) -> None:
    with worker_process(QUEUES, concurrency=1, name="command-cancel", env=FAST):
        run_id, pid = _started("test-command", 120, ignore_sigterm=True)

        request_cancel(run_id, actor="test", kill=kill)

        wait_for(lambda: _state(run_id) == "cancelled", timeout=20)
        wait_for(lambda: not _alive(pid), timeout=10)


def test_the_hard_timeout_takes_the_command_with_it() -> None:
    with worker_process(QUEUES, concurrency=1, name="command-timeout", env=FAST):
        run_id, pid = _started("test-command-timeout", 120)

        wait_for(lambda: _state(run_id) == "failed", timeout=20)
        wait_for(lambda: not _alive(pid), timeout=10)

    assert TaskHistory.objects.get(id=run_id).error["kind"] == "timeout"


def test_a_killed_pool_child_takes_its_command_and_the_run_is_tried_again() -> None:
    with worker_process(QUEUES, concurrency=1, name="command-child", env=FAST):
        run_id, pid = _started("test-command", 4)
        # setpriv execs the command: its parent is the pool process that runs the handler.
        os.kill(int(_stat(pid)[1]), signal.SIGKILL)

        wait_for(lambda: not _alive(pid), timeout=10)
        wait_for(lambda: _state(run_id) == "completed", timeout=60)

    first, *again = _commands(run_id)
    assert first == pid and again, "the run was not tried again"
    assert TaskHistory.objects.get(id=run_id).attempts >= 2
