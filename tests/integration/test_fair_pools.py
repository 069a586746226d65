"""Fair pools (issue 14): tasks sharing a pool take turns within a priority step, and a more
urgent step still goes first across the pool.

One real worker (concurrency 1, so the order it takes messages in is the order they run in)
consumes both tasks' queues. With a fixed queue order (kombu's "priority" strategy) whichever
queue the worker lists first runs all its work before the other's first run (measured: A's
500 before any B, or B's 20 in one go, by the order the worker happened to list them). The
assertions are on positions in the recorded order, never on wall time.
"""

from __future__ import annotations

import pytest

from orchestrator.runs.start import start_run
from orchestrator.stores import valkey
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for, worker_process
from tests.support.task_defs import ORDER_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

BACKLOG = 500
LATECOMERS = 20
URGENT = 5


def _start(task: str, label: str, priority: int) -> None:
    start_run(task, {"label": label}, trigger=TriggerKind.MANUAL, priority=priority)


def test_a_backlog_does_not_starve_its_pool_mates_at_the_same_priority() -> None:
    client = valkey.client()
    client.delete(ORDER_KEY)
    for index in range(BACKLOG):
        _start("test-fair-a", f"A:{index}", 5)
    for index in range(LATECOMERS):
        _start("test-fair-b", f"B:{index}", 5)
    # Started last, from the backlogged task: a lower number still goes first.
    for index in range(URGENT):
        _start("test-fair-a", f"U:{index}", 3)

    queues = ["task.t.test-fair-a", "task.t.test-fair-b"]
    with worker_process(queues, concurrency=1, name="fair"):
        wait_for(
            lambda: (
                sum(label.startswith("B:") for label in client.lrange(ORDER_KEY, 0, -1))
                == LATECOMERS
            ),
            timeout=120,
        )
    order = client.lrange(ORDER_KEY, 0, -1)

    assert order[:URGENT] == [f"U:{index}" for index in range(URGENT)]
    last_b = max(position for position, label in enumerate(order) if label.startswith("B:"))
    taking_turns = order[URGENT : last_b + 1]
    # Turns, whichever queue the worker happens to list first: no task runs twice in a row
    # while the other has work at the same step (one of slack for a message reserved before
    # the rotation). A fixed order fails either way: A's 500 first, or B's 20 in one go.
    assert _longest_streak(taking_turns) <= 2, taking_turns
    a_done = sum(label.startswith("A:") for label in taking_turns)
    assert a_done <= LATECOMERS + 2
    assert BACKLOG - a_done > 450  # A's backlog is far from drained when B has finished
    # Each task's own runs still go first in, first out.
    bs = [label for label in order if label.startswith("B:")]
    assert bs == [f"B:{index}" for index in range(LATECOMERS)]


def _longest_streak(labels: list[str]) -> int:
    """The most consecutive runs of one task in `labels` ("A:3", "B:0", ...)."""
    longest = streak = 0
    previous = ""
    for label in labels:
        task = label.split(":", 1)[0]
        streak = streak + 1 if task == previous else 1
        previous = task
        longest = max(longest, streak)
    return longest
