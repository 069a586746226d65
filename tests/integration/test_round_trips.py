"""The round-trip guard (issues 9 and 22): what one no-op run costs in Postgres statements,
Valkey commands, broker writes and commits that wait for their WAL flush, counted rather than
timed, for a task without limits and for one with every limit. A count above its pin fails,
so a change that adds a round trip or a synchronous commit to the hot path has to say so here.

`start` is one `start_run` (admission, the insert, the commit and the publish after it);
`run` is the Celery task body's call into the runner for that run, in this process, from
pickup to the terminal write. A warm-up run first pays what a process pays once (connections,
script loads, queue declarations). Run with `-s` to see the per-step table (for
docs/benchmarks.md).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings

from orchestrator.models import TaskHistory
from orchestrator.routing import class_queues
from orchestrator.runs import runner
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.messages import take_message
from tests.support.round_trips import Counts, Recording, recording

pytestmark = pytest.mark.django_db(transaction=True)

PLAIN = "test-rt-plain"  # no quota, concurrency, rate or identity
LIMITED = "test-rt-limited"  # all four


def _depth_scan() -> int:
    """The backpressure check's LLENs: one per priority step of every queue of the io class,
    so it grows with the test registry's io tasks; pinned as such, not as a number."""
    queues = class_queues(registry.get().values(), "io", settings.CONFIG.per_task_queues)
    return len(keys.BROKER_PRIORITY_STEPS) * len(queues)


DEPTH_SCAN = _depth_scan()
# The most each path may cost; lower a pin when a change saves a round trip.
# fmt: off
PINS: dict[tuple[str, str], Counts] = {
    #                   postgres  valkey  valkey_commands  broker  broker_commands  sync_commits
    # The seed carries the run's /metrics count (HINCRBY) in its round trip. The pause check
    # (one HMGET, issue 27) rides in admission's and the pickup's pipelines: a command more
    # at each, no round trip.
    # Outside a caller's transaction, a start with nothing to roll back (no key, no capped
    # quota) sends its INSERT alone: it commits by itself, no BEGIN and COMMIT round trips.
    ("start", PLAIN):   Counts(1, 2, 6, 2, 1 + DEPTH_SCAN, 1),
    # The pickup hooks and the Valkey claim, one pipeline; nothing read (the message carries
    # the row); the end, which takes the claim with it; the run's end in Valkey: its script
    # (the move, /metrics' and the day's counts, the PUBLISH to waiters) and the hooks'
    # commands, one pipeline.
    ("run", PLAIN):     Counts(1, 2, 4, 0, 0, 1),
    ("start", LIMITED): Counts(4, 3, 6, 2, 1 + DEPTH_SCAN, 1),
    ("run", LIMITED):   Counts(3, 4, 8, 0, 0, 2),
}
# fmt: on
# Issue 22: what a no-op run of a task without limits may cost while a worker drains a queue.
RUN_ROUND_TRIPS = 3
RUN_SYNC_COMMITS = 1
# Issue 37: what a start of such a task may cost (admission, the INSERT, the seed, the publish).
START_ROUND_TRIPS = 4


def _input(task_id: str) -> dict[str, Any]:
    # A fresh identity each time: the limited task deduplicates by it.
    return {"key": uuid.uuid4().hex} if task_id == LIMITED else {}


@pytest.fixture(autouse=True)
def _free_slots() -> None:
    """Slots or a waiting line of these tasks left by an earlier test would postpone a run
    here, and a postponed run is not the path being counted."""
    for task_id in (PLAIN, LIMITED):
        valkey.client().delete(
            keys.concurrency_holders(task_id),
            keys.concurrency_waiters(task_id),
            keys.concurrency_postponed(task_id),
            keys.rate_window(task_id),
        )


def _one_run(task_id: str) -> tuple[Recording, Recording]:
    with recording() as start:
        handle = start_run(task_id, _input(task_id), trigger=TriggerKind.MANUAL)
    # Delivered as a worker takes it: with what its message carries.
    args, kwargs = take_message(task_id, handle.run_id)
    with recording() as run:
        runner.run_message(task_id, *args, carried=kwargs.get("carried"))
    assert TaskHistory.objects.get(id=handle.run_id).state == "completed"
    return start, run


def _table(measured: dict[tuple[str, str], Counts]) -> str:
    lines = [
        "| path | task | round trips | Postgres | Valkey (commands) | broker (commands)"
        " | commits waiting for a flush |",
        "|---|---|---|---|---|---|---|",
    ]
    for (path, task_id), c in measured.items():
        lines.append(
            f"| {path} | {task_id} | {c.postgres + c.valkey + c.broker} | {c.postgres}"
            f" | {c.valkey} ({c.valkey_commands})"
            f" | {c.broker} ({c.broker_commands}) | {c.sync_commits} |"
        )
    return "\n".join(lines)


def test_a_no_op_run_costs_no_more_round_trips_than_pinned() -> None:
    measured: dict[tuple[str, str], Counts] = {}
    steps: list[str] = []
    for task_id in (PLAIN, LIMITED):
        # Warm-up, twice: the first run's watch takes a pool connection for the process's
        # cancel channel (and keeps it), so the pool opens the one its pipelines use next; a
        # process pays that handshake once, not per run.
        _one_run(task_id)
        _one_run(task_id)
        for path, caught in zip(("start", "run"), _one_run(task_id), strict=True):
            measured[path, task_id] = caught.counts()
            steps.append(f"\n{path}, {task_id}:\n\n{caught.steps_table()}")
    report = _table(measured) + "\n" + "\n".join(steps)
    print(report)

    plain = measured["run", PLAIN]
    assert plain.postgres + plain.valkey + plain.broker <= RUN_ROUND_TRIPS, report
    assert plain.sync_commits <= RUN_SYNC_COMMITS, report
    started = measured["start", PLAIN]
    assert started.postgres + started.valkey + started.broker <= START_ROUND_TRIPS, report

    grown = {
        where: (count, PINS[where])
        for where, count in measured.items()
        if any(now > pinned for now, pinned in zip(count, PINS[where], strict=True))
    }
    assert not grown, f"round trips grew past their pins: {grown}\n\n{report}"
