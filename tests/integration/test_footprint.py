"""What one no-op run executes, counted (issue 37, style item 15): the project files and
functions that run from `start_run` to the acknowledgement of the run's message.

Recorded with `sys.setprofile` (`tests.support.footprint`) on both sides:
- the caller: the thread that calls `start_run`, from its call to its return (admission, the
  insert, its commit and the publish after it: the test runs in autocommit);
- a real Celery worker, solo pool, one process (`tests.support.footprint_worker`): every
  thread of it, from just before the start (armed by a signal) to the call of kombu's ack of
  the run's message, which stops the recording in every thread at once. The test checks that
  the ack stopped it and that Postgres has the run completed and the broker's unacked hash no
  longer holds its message before it reads the recording.

The worker is warmed by one run first (connections, script loads, the watch's threads, imports
done in functions), which is not counted. Then RUNS runs are recorded one by one, and what is
counted is what **every** one of them executed: a timer's tick that happened to fall in a
run's short window (the node roster's announce every 10 s, the Postgres beat thread's look
every 0.25 s, the lease thread's) is not what a run executes; the watch thread's tick for the
run is, when it runs before the ack. What some runs
executed and not all is printed apart.

Not counted: tests/ (the no-op handler), installed packages (Django, Celery, kombu, redis-py),
C functions, and what happens after the ack (the watch thread's next tick, say: unless the next
run's window holds it every time, then it counts).

`python -m pytest tests/integration/test_footprint.py -s` prints the list (for
docs/architecture.md, "One run, file by file", and docs/benchmarks.md, "What one run executes").
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import current_app
from django.conf import settings

from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import broker, keys
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for
from tests.support.footprint import Calls, Footprint, Recorder
from tests.support.footprint_worker import RecordingWorker, recording_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

# A no-op task without limits whose queue no shared worker takes (test-noop's is the shared
# worker's, which would take the message first): test-noop's handler, and its overlap policy
# (which only schedules read) is the one difference.
TASK = "test-rt-plain"
RUNS = 3

# A ratchet: the most a no-op run may execute today. Issue 37's target is 15 files (aim 12);
# each slice of the lean core lowers these pins to what it measures, and nothing may raise them.
# Measured at 8d833f7: 41 files, 166 functions (issue 37 counted 43 and 191 at 195afb7, its own
# way: this test's rules are in its docstring). Per-task hook plans: a task that declares no
# identity, limit, rate or cost cap runs none of dedup, concurrency, rate limit and costs, nor
# the base class's empty plans: 37 files, 152 functions.
# Raised once, by one: `valkey.command` (a project function) took the place of redis-py's pool
# checkout and return (library code, which this count does not see) for the run's scripts.
# Issue 37's fourth session met the target by making each store's helpers one module and the
# path's base-module helpers run no Python of ours (a cached instance id and queue, the clock
# bound to datetime.now): 15 files, 100 functions. Issue 37's "One run, file by file"
# (docs/architecture.md) names exactly these files.
# Issue 42's search slice measured 97 functions: a start without a delay no longer calls
# `due_time` (now in runs.due, asked only for a delayed start), and tracing off adds none.
MAX_FILES = 15
MAX_FUNCTIONS = 97


ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _documented_files() -> set[str]:
    """The files "One run, file by file" links to (`[name](../path.py)`)."""
    section = ARCHITECTURE.read_text().split("## One run, file by file\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    return set(re.findall(r"\]\(\.\./([\w/]+\.py)\)", section))


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[RecordingWorker]:
    queue = queue_name(registry.get()[TASK], settings.CONFIG.per_task_queues)
    with current_app.connection_for_write() as conn:
        # Other tests run this task in their own process and leave its messages queued.
        conn.default_channel.queue_purge(queue)
    with recording_worker([queue], tmp_path) as started:
        yield started


def _done(run_id: str) -> bool:
    """Completed in Postgres and its message acknowledged (out of kombu's unacked hash)."""
    if TaskHistory.objects.get(id=run_id).state != RunState.COMPLETED:
        return False
    return not any(run_id in entry for entry in broker.client().hvals(keys.BROKER_UNACKED))


def _start() -> str:
    return start_run(TASK, {}, trigger=TriggerKind.MANUAL).run_id


def _recorded_start() -> tuple[str, Calls]:
    recorder = Recorder()
    before = sys.getprofile()
    recorder.armed = True
    sys.setprofile(recorder.profile)
    try:
        run_id = _start()
    finally:
        sys.setprofile(before)
        recorder.armed = False
    return run_id, recorder.snapshot()


def _one_run(worker: RecordingWorker) -> Footprint:
    worker.arm()
    run_id, caller = _recorded_start()
    wait_for(lambda: _done(run_id), timeout=30)
    calls, stopped_at_ack = worker.collect()
    assert stopped_at_ack, "the worker's recording did not end at the ack"
    return Footprint.of({"caller": caller, "worker": calls})


def test_one_no_op_run_executes_no_more_files_than_pinned(worker: RecordingWorker) -> None:
    warm = _start()
    wait_for(lambda: _done(warm), timeout=30)
    runs = [_one_run(worker) for _ in range(RUNS)]
    counted = Footprint.in_every(runs)

    print(f"\nWhat one no-op run executes ({TASK}, start_run to the ack): {counted.report()}")
    for number, run in enumerate(runs, 1):
        extra = run.minus(counted)
        print(f"\nrun {number}: {len(run.files)} files, {run.functions()} functions", end="")
        print(f"; not in every run: {json.dumps(extra)}" if extra else "")

    if (len(counted.files), counted.functions()) < (MAX_FILES, MAX_FUNCTIONS):
        print(f"\nBelow the pins ({MAX_FILES} files, {MAX_FUNCTIONS} functions): lower them.")
    assert len(counted.files) <= MAX_FILES, (
        f"a no-op run executes {len(counted.files)} files, pinned at {MAX_FILES}: "
        f"{sorted(counted.files)}"
    )
    assert counted.functions() <= MAX_FUNCTIONS, (
        f"a no-op run executes {counted.functions()} functions, pinned at {MAX_FUNCTIONS}"
    )
    documented = _documented_files()
    assert documented == set(counted.files), (
        "docs/architecture.md, One run, file by file, must link exactly the files a run "
        f"executes: not executed {sorted(documented - set(counted.files))}, "
        f"not linked {sorted(set(counted.files) - documented)}"
    )
