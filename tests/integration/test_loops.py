"""`python -m orchestrator.loops` as the worker role runs it: a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.clock import SYSTEM
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.stores import keys, valkey
from tests.faults.servers import free_port
from tests.support.fixtures import ROOT, database_url, wait_for
from tests.support.runs import seed_orphan

pytestmark = [pytest.mark.django_db(transaction=True)]

# The reconciler and the drain run on the cluster leader (orchestrator/cluster/leaders.py).
LOCK = keys.orchestrator_lock(CLUSTER)


@pytest.fixture(autouse=True)
def _clean() -> None:
    valkey.client().delete(LOCK)


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "LUMASTRA_WORKER_MODE": "enabled",
        **extra,
    }


def _loops(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.loops", *args],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_web_role_refuses_to_run_the_loops() -> None:
    process = _loops("--once", LUMASTRA_WORKER_MODE="disabled")
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 2
    assert "LUMASTRA_WORKER_MODE is not 'enabled'" in output


def test_boot_recovery_runs_once_at_start_and_logs_a_count() -> None:
    stale = seed_orphan(200)  # past the boot threshold (120 s), not the regular one (300 s)
    beating = seed_orphan(30)

    process = _loops("--once")
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 0, output
    assert "boot recovery: 1 orphans failed" in output
    assert TaskHistory.objects.get(id=stale).state == "failed"
    assert TaskHistory.objects.get(id=beating).state == "active"
    assert not valkey.client().exists(LOCK), "the lock is handed over on exit"


def test_sigterm_stops_the_loops_cleanly_and_hands_the_lock_over() -> None:
    process = _loops(LUMASTRA_RECONCILE_INTERVAL_S="1", LUMASTRA_DRAIN_INTERVAL_S="1")
    try:
        holder = wait_for(lambda: valkey.client().get(LOCK), timeout=60)
        assert f":{process.pid}:" in holder
        # Ticks go on while it runs: a new orphan is ended within an interval or two.
        orphan = seed_orphan(400)
        wait_for(lambda: TaskHistory.objects.get(id=orphan).state == "failed", timeout=30)

        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.returncode == 0, output
    assert time.monotonic() - started < 10
    assert "loops started: reconciler every 1s, drain every 1s" in output
    assert "leader: racing for lock:orch:cluster (lease" in output  # the one seat
    assert "loops stopped" in output
    assert not valkey.client().exists(LOCK)


def test_signals_close_behind_one_another_stop_the_loops_once() -> None:
    # Under honcho the worker role's SIGTERM follows its process group's by a few ms: a handler
    # that set the stop event itself deadlocked the process (the lock the event's own wait
    # held) or, ending, left it to die of a late signal (-15). A burst makes either likely.
    process = _loops()
    try:
        assert process.stdout is not None
        # Its last line before the main thread waits for a signal.
        while "leader: racing for" not in process.stdout.readline():
            assert process.poll() is None, "the loops process ended on its own"

        started = time.monotonic()
        for _ in range(200):
            process.send_signal(signal.SIGTERM)
            time.sleep(0)  # lets the process run between two: pending signals merge
        output, _ = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.returncode == 0, output
    assert time.monotonic() - started < 10
    assert output.count("loops: SIGTERM received, stopping") == 1
    assert "loops stopped" in output


def test_once_rolls_the_daily_counts_of_uncapped_tasks_up() -> None:
    day = SYSTEM.now().date()
    valkey.client().hset(keys.quota_counts("test-noop", day.isoformat()), "completed", 7)

    process = _loops("--once")
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 0, output
    assert TaskQuotaUsage.objects.get(task_id="test-noop", day=day).completed == 7


def test_once_runs_the_coverage_sweep_and_dispatcher_on_the_leader() -> None:
    from coverage.models import EventOutbox, MediaItem, MediaItemStageState

    movie = MediaItem.objects.create(kind="movie", library="Movies", title="new")
    assert EventOutbox.objects.filter(item_id=movie.pk).exists()

    process = _loops("--once")
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 0, output
    assert "stage-sweep (boot):" in output
    assert not EventOutbox.objects.filter(item_id=movie.pk).exists()  # dispatched
    assert MediaItemStageState.objects.filter(item=movie, stage="test-probe").exists()


def test_a_stage_whose_condition_does_not_parse_stops_the_loops_at_start() -> None:
    process = _loops(
        "--once", LUMASTRA_TASK_MODULES="tasks.definitions.demo,tests.support.registry_defs_bad_sql"
    )
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 2, output
    assert "task 'bad-sql-task', stage 'bad-sql': eligible_sql is not a valid condition" in output
    assert "no_such_column" in output


def test_postgres_unreachable_at_start_is_waited_for_not_taken_for_a_bad_condition() -> None:
    """The fault battery's Postgres outage once started a loops process mid-cut: it exited 2,
    reporting every coverage condition invalid, and nothing replayed the drain after."""
    process = _loops("--once", DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/x")
    try:
        assert process.stdout is not None
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            seen.append(line)
            if ("Postgres unreachable" in line and "checked again" in line) or not line:
                break
        assert process.poll() is None, "".join(seen)
        assert "not a valid condition" not in "".join(seen)
    finally:
        process.kill()
        process.communicate(timeout=30)


def test_manage_check_names_a_stage_whose_condition_does_not_parse() -> None:
    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--database", "default"],
        cwd=ROOT,
        env=_env(LUMASTRA_TASK_MODULES="tests.support.registry_defs_bad_sql"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert checked.returncode == 1
    assert "coverage.E001" in checked.stderr and "stage 'bad-sql'" in checked.stderr


def test_with_the_json_format_every_line_of_a_role_is_a_json_object() -> None:
    process = _loops("--once", LUMASTRA_LOG_FORMAT="json")
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 0, output
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert lines and all({"event", "level", "logger", "instance"} <= set(line) for line in lines)
    assert any("boot recovery" in line["event"] for line in lines)
