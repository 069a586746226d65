"""`ctx.run_process` (issue 23): real commands, their output, their CPU, and every way they are
stopped with the run, down to the processes they forked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from orchestrator.runs import leftovers
from orchestrator.runs.context import RunContext
from orchestrator.runs.process import MAX_LOGGED_LINES
from tasks import PermanentError, ProcessFailed, RunCancelled
from tasks.definition import NoInput
from tasks.errors import ErrorKind
from tests.support.fixtures import ROOT, wait_for

PYTHON = sys.executable
# A command that forks a grandchild into its own group, says both pids and waits; with
# `deaf`, both ignore SIGTERM, so only the SIGKILL after the grace stops them.
FAMILY = textwrap.dedent(
    """
    import os, signal, sys, time
    if sys.argv[1] == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    print(os.getpid(), child, flush=True)
    time.sleep(600)
    """
)


def _context() -> RunContext:
    """A run's context whose log lines are also kept here, every one (the run's own log in
    Valkey is capped), in `ctx.written`."""
    ctx = RunContext("run_01PROCESS0000000000000000", NoInput())
    written: list[str] = []
    write = ctx.run_log.write

    def recorded(level: str, message: str) -> None:
        written.append(message)
        write(level, message)

    ctx.run_log.write = recorded  # type: ignore[method-assign]
    ctx.written = written  # type: ignore[attr-defined]
    return ctx


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead; only its parent has not waited for it yet.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def _logged(ctx: RunContext) -> list[str]:
    return list(ctx.written)  # type: ignore[attr-defined]


def test_output_goes_to_the_callback_and_the_log_and_cpu_is_charged(tmp_path: Path) -> None:
    ctx = _context()
    seen: list[str] = []
    script = (
        "import sys\n"
        "n = 0\n"
        "for i in range(3_000_000): n += i\n"
        "print('out_time_us=1000000'); print('progress=end')\n"
        "print('a note', file=sys.stderr)\n"
    )

    result = ctx.run_process([PYTHON, "-c", script], cwd=tmp_path, on_stdout=seen.append)

    assert result.exit_code == 0
    assert seen == ["out_time_us=1000000", "progress=end"]
    assert "a note" in _logged(ctx)
    assert "out_time_us=1000000" not in _logged(ctx)  # the callback's, not the log's
    # stdout and stderr in the order they arrived, which between two pipes is the reader's
    assert set(result.tail) == {"out_time_us=1000000", "progress=end", "a note"}
    assert result.cpu_seconds > 0.05
    assert ctx.cost["cpu_seconds"] == result.cpu_seconds
    assert _logged(ctx)[-1] == (
        f"{PYTHON} exited with 0 after {result.wall_seconds:.3f} s ({result.cpu_seconds:.3f} CPU s)"
    )


def test_only_the_environment_given_and_the_folder_given(tmp_path: Path) -> None:
    ctx = _context()
    os.environ["LUMASTRA_TEST_SECRET"] = "not for the command"
    try:
        result = ctx.run_process(
            [PYTHON, "-c", "import os; print(sorted(os.environ)); print(os.getcwd())"],
            cwd=tmp_path,
            env={"ONLY": "this"},
        )
    finally:
        del os.environ["LUMASTRA_TEST_SECRET"]
    names, folder = _logged(ctx)[-3:-1]  # before the line that says it exited
    assert "LUMASTRA_TEST_SECRET" not in names and "ONLY" in names
    assert leftovers.RUN_MARK in names  # and the marks that find what it leaves behind
    assert folder == str(tmp_path)
    assert result.exit_code == 0


def test_a_failed_command_raises_the_kind_the_task_chose(tmp_path: Path) -> None:
    ctx = _context()
    script = "import sys; print('moov atom not found', file=sys.stderr); sys.exit(1)"

    with pytest.raises(ProcessFailed) as failed:
        ctx.run_process(
            [PYTHON, "-c", script],
            cwd=tmp_path,
            fails_as=lambda r: ErrorKind.PERMANENT if "moov" in r.tail[-1] else ErrorKind.TRANSIENT,
        )

    assert failed.value.kind is ErrorKind.PERMANENT and failed.value.exit_code == 1
    assert "exited with 1" in str(failed.value) and "moov atom not found" in str(failed.value)


def test_bad_calls_are_refused_before_anything_runs(tmp_path: Path) -> None:
    ctx = _context()
    with pytest.raises(ValueError, match="no shell"):
        ctx.run_process("echo hi", cwd=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a directory"):
        ctx.run_process(["true"], cwd=tmp_path / "missing")
    with pytest.raises(PermanentError, match="'no-such-tool' is not installed"):
        ctx.run_process(["no-such-tool", "-i", "x"], cwd=tmp_path)


@pytest.mark.parametrize("deaf", [False, True], ids=["stops-on-sigterm", "ignores-sigterm"])
def test_a_cancel_stops_the_command_and_what_it_forked(
    tmp_path: Path, deaf: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = _context()
    pids: list[int] = []

    def on_stdout(line: str) -> None:
        pids.extend(int(p) for p in line.split())
        ctx.trip_cancel()

    with pytest.raises(RunCancelled):
        ctx.run_process(
            [PYTHON, "-c", FAMILY, "deaf" if deaf else "polite"],
            cwd=tmp_path,
            on_stdout=on_stdout,
            grace_s=1.0,
        )

    assert len(pids) == 2
    wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=5)
    # SIGKILL only for a group that outlived its grace after SIGTERM.
    assert ("after SIGTERM; killing" in caplog.text) is deaf


def test_a_cancelled_command_is_charged_the_cpu_it_used(tmp_path: Path) -> None:
    ctx = _context()
    # Busy for about 0.3 s of CPU, then says so and waits to be stopped.
    script = (
        "import time\n"
        "began = time.process_time()\n"
        "while time.process_time() - began < 0.3: pass\n"
        "print('busy', flush=True)\n"
        "time.sleep(600)\n"
    )

    with pytest.raises(RunCancelled):
        ctx.run_process([PYTHON, "-c", script], cwd=tmp_path, on_stdout=lambda _: ctx.trip_cancel())

    assert ctx.cost["cpu_seconds"] >= 0.3


def test_an_exception_in_the_handler_thread_stops_the_command(tmp_path: Path) -> None:
    ctx = _context()
    pids: list[int] = []

    def on_stdout(line: str) -> None:
        pids.extend(int(p) for p in line.split())
        raise RuntimeError("the parser choked")

    with pytest.raises(RuntimeError, match="choked"):
        ctx.run_process([PYTHON, "-c", FAMILY, "polite"], cwd=tmp_path, on_stdout=on_stdout)

    wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=5)


def test_a_chatty_command_logs_a_bounded_number_of_lines(tmp_path: Path) -> None:
    ctx = _context()
    lines = MAX_LOGGED_LINES + 500

    result = ctx.run_process([PYTHON, "-c", f"for i in range({lines}): print(i)"], cwd=tmp_path)

    assert result.tail[-1] == str(lines - 1)
    assert sum(1 for m in _logged(ctx) if m.isdigit()) == MAX_LOGGED_LINES


def _in_a_pool_process(run_id: str, argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    """A process like a pool child (Django set up, one run's context) that runs `argv` through
    `run_process` and prints each line of its output."""
    runner = textwrap.dedent(
        f"""
        import os, sys, django
        sys.path.insert(0, {str(ROOT)!r})
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
        django.setup()
        from orchestrator.runs.context import RunContext
        from tasks.definition import NoInput
        ctx = RunContext({run_id!r}, NoInput())
        ctx.run_process(
            {argv!r}, cwd={str(cwd)!r}, on_stdout=lambda line: print(line, flush=True)
        )
        """
    )
    return subprocess.Popen(
        [PYTHON, "-c", runner], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )


def test_the_command_dies_with_the_process_that_ran_it(tmp_path: Path) -> None:
    """The pool child SIGKILLed (a watchdog, kill now, the OOM killer): the kernel sends the
    command its parent-death signal."""
    sleeper = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    parent = _in_a_pool_process("run_01PROCESS0000000000000001", [PYTHON, "-c", sleeper], tmp_path)
    assert parent.stdout is not None
    reader: list[str] = []
    thread = threading.Thread(target=lambda: reader.append(parent.stdout.readline()))  # type: ignore[union-attr]
    thread.start()
    thread.join(timeout=60)
    assert reader and reader[0].strip().isdigit(), "the command did not start"
    command = int(reader[0])
    assert _alive(command)

    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)

    wait_for(lambda: not _alive(command), timeout=5)


# A command that forks a grandchild out of its group and session (`setsid`) and out of its
# parent-death signal, says the grandchild's pid and exits 0 (or waits, with "wait").
ESCAPER = textwrap.dedent(
    """
    import ctypes, os, sys, time
    child = os.fork()
    if child == 0:
        os.setsid()
        ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
    """
)


def test_what_left_the_group_is_killed_when_the_command_ends(tmp_path: Path) -> None:
    ctx = _context()
    escaped: list[int] = []

    ctx.run_process(
        [PYTHON, "-c", ESCAPER, "exit"],
        cwd=tmp_path,
        on_stdout=lambda line: escaped.append(int(line)),
    )

    wait_for(lambda: not _alive(escaped[0]), timeout=5)


def test_the_host_sweep_kills_what_a_dead_pool_process_left(tmp_path: Path) -> None:
    """The pool process SIGKILLed: the death signal takes the command, not a grandchild that
    dropped it and left the group; the worker host's sweep finds it by its marks."""
    parent = _in_a_pool_process(
        "run_01PROCESS0000000000000002", [PYTHON, "-c", ESCAPER, "wait"], tmp_path
    )
    assert parent.stdout is not None
    escaped = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    time.sleep(0.5)
    assert _alive(escaped), "the grandchild should have outlived its pool process"

    swept = leftovers.sweep()

    # (What other dead pool processes on this host left is swept too.)
    assert (escaped, "run_01PROCESS0000000000000002") in [(p.pid, p.run_id) for p in swept]
    wait_for(lambda: not _alive(escaped), timeout=5)


def test_the_host_sweep_leaves_a_live_pool_process_s_commands(tmp_path: Path) -> None:
    ctx = _context()
    seen: list[int] = []

    def on_stdout(line: str) -> None:
        seen.append(int(line))
        assert escaped_of_mine() == seen  # found by its marks ...
        assert leftovers.sweep() == []  # ... and left alone: its owner is alive
        ctx.trip_cancel()

    def escaped_of_mine() -> list[int]:
        return [p.pid for p in leftovers.marked() if p.run_id == ctx.run_id and p.pid in seen]

    with pytest.raises(RunCancelled):
        ctx.run_process([PYTHON, "-c", ESCAPER, "wait"], cwd=tmp_path, on_stdout=on_stdout)

    wait_for(lambda: not _alive(seen[0]), timeout=5)
