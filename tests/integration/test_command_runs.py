"""A run whose work is a command (`ctx.run_process`, issue 23) on a real worker: every way the
run ends takes the command with it — a cancel, kill now, the hard timeout, a stall, its pool
child SIGKILLed — and the run ends as each path promises. Each runs a Python stand-in (which
can ignore SIGTERM) and real ffmpeg encoding a test pattern."""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator.models import TaskHistory
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.processes import alive, run_commands

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

QUEUES = ["task.t.test-command", "task.t.test-command-timeout", "task.t.test-command-watched"]
FAST = {"LUMASTRA_HEARTBEAT_INTERVAL_S": "1", "LUMASTRA_CANCEL_ESCALATE_S": "3"}
PROGRAMS = [
    "python",
    pytest.param(
        "ffmpeg",
        marks=pytest.mark.needs("media"),
    ),
]


def _state(run_id: str) -> str:
    return str(TaskHistory.objects.values_list("state", flat=True).get(id=run_id))


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: state, parent pid, …"""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _started_command(task: str, seconds: float, **extra: object) -> tuple[str, int]:
    run_id = start_run(task, {"seconds": seconds, **extra}, trigger=TriggerKind.MANUAL).run_id
    pid = wait_for(lambda: run_commands(run_id), timeout=30)[0]
    assert alive(pid)
    return run_id, pid


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("kill", [False, True], ids=["cancel", "kill-now"])
def test_a_cancelled_run_takes_its_command_with_it(kill: bool, program: str) -> None:
    with worker_process(QUEUES, concurrency=1, name="command-cancel", env=FAST):
        # The stand-in ignores SIGTERM: only the SIGKILL after the grace stops it.
        deaf = {"ignore_sigterm": True} if program == "python" else {}
        run_id, pid = _started_command("test-command", 120, program=program, **deaf)

        request_cancel(run_id, actor="test", kill=kill)

        wait_for(lambda: _state(run_id) == "cancelled", timeout=20)
        wait_for(lambda: not alive(pid), timeout=10)


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_hard_timeout_takes_the_command_with_it(program: str) -> None:
    with worker_process(QUEUES, concurrency=1, name="command-timeout", env=FAST):
        run_id, pid = _started_command("test-command-timeout", 120, program=program)

        wait_for(lambda: _state(run_id) == "failed", timeout=20)
        wait_for(lambda: not alive(pid), timeout=10)

    assert TaskHistory.objects.get(id=run_id).error["kind"] == "timeout"


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_killed_pool_child_takes_its_command_and_the_run_is_tried_again(program: str) -> None:
    with worker_process(QUEUES, concurrency=1, name="command-child", env=FAST):
        run_id, pid = _started_command("test-command", 4, program=program)
        # setpriv execs the command: its parent is the pool process that runs the handler.
        os.kill(int(_stat(pid)[1]), signal.SIGKILL)

        wait_for(lambda: not alive(pid), timeout=10)
        wait_for(lambda: _state(run_id) == "completed", timeout=60)

    first, *again = run_commands(run_id)
    assert first == pid and again, "the run was not tried again"
    assert TaskHistory.objects.get(id=run_id).attempts >= 2


@pytest.mark.needs("media")
def test_a_command_writing_output_is_alive_and_a_silent_one_stalls() -> None:
    """Stall limit 3 s: ffmpeg's progress lines keep a 6 s encode alive; a command that says
    nothing for 6 s fails the run as stalled and is stopped with it."""
    with worker_process(QUEUES, concurrency=2, name="command-stall", env=FAST):
        talking, _ = _started_command("test-command-watched", 6, program="ffmpeg")
        silent, pid = _started_command("test-command-watched", 60, program="python")

        wait_for(lambda: _state(silent) == "failed", timeout=20)
        wait_for(lambda: not alive(pid), timeout=10)
        wait_for(lambda: _state(talking) == "completed", timeout=30)

    assert TaskHistory.objects.get(id=silent).error["kind"] == "stalled"
