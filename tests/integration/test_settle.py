"""The one settle path (`settle` in orchestrator/runs/terminal.py): once Postgres holds a
run's end, the live hash follows (fenced by the claim's owner), counted and announced by its
script, and the `finished` hooks hear of it once. Valkey unreachable while it follows is the
fault battery's business (the valkey-restart scenarios)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from orchestrator.clock import SYSTEM
from orchestrator.hooks import dispatch
from orchestrator.hooks.base import Outcome, Part, RunHook
from orchestrator.runs.start import new_run_id
from orchestrator.runs.terminal import settle
from orchestrator.states import RunState
from orchestrator.stores import counters, keys, live, valkey
from tasks.errors import ErrorKind

TASK = "test-noop"
OWNER = "host:1:OWNER"


@dataclass
class Recorder(RunHook):
    name: str = "recorder"
    heard: list[Outcome] = field(default_factory=list)

    def plan_finished(self, outcome: Outcome) -> Part:
        return Part(lambda replies: self.heard.append(outcome))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """The installed chain plus a hook that records what `finished` hears."""
    chain = dispatch.installed()
    hook = Recorder()
    dispatch.install((*chain, hook))
    try:
        yield hook
    finally:
        dispatch.install(chain)


def _claimed() -> str:
    run_id = new_run_id()
    live.seed(run_id, TASK, 5, ())
    live.claim(run_id, OWNER, live.NO_PAUSE)
    return run_id


def test_the_hash_follows_and_the_hooks_hear_once(recorder: Recorder) -> None:
    run_id = _claimed()

    moved = settle(run_id, TASK, RunState.FAILED, owner=OWNER, error_kind=ErrorKind.TRANSIENT)

    assert moved
    assert live.read(run_id)["state"] == "failed"
    assert [(o.run_id, o.state, o.owner, o.error_kind) for o in recorder.heard] == [
        (run_id, RunState.FAILED, OWNER, ErrorKind.TRANSIENT)
    ]


def test_another_owner_cannot_move_the_hash_but_the_hooks_still_hear(recorder: Recorder) -> None:
    run_id = _claimed()

    moved = settle(run_id, TASK, RunState.COMPLETED, owner="host:2:LATE")

    assert not moved
    assert live.read(run_id)["state"] == "active"
    assert len(recorder.heard) == 1  # Postgres has the end: the hooks must hear of it


def test_an_owner_that_is_gone_is_not_a_fence(recorder: Recorder) -> None:
    run_id = _claimed()

    assert settle(run_id, TASK, RunState.FAILED, owner="host:9:GONE", fenced=False)
    assert live.read(run_id)["state"] == "failed"
    assert recorder.heard[0].owner == "host:9:GONE"  # the hooks give back what it took


@pytest.mark.parametrize("claimed", [True, False], ids=["active", "pending"])
def test_a_cancel_postgres_recorded_reaches_a_hash_that_never_heard_of_it(
    recorder: Recorder, claimed: bool
) -> None:
    run_id = new_run_id()
    live.seed(run_id, TASK, 5, ())
    if claimed:
        live.claim(run_id, OWNER, live.NO_PAUSE)

    assert settle(run_id, TASK, RunState.CANCELLED, owner=OWNER if claimed else "")
    assert live.read(run_id)["state"] == "cancelled"


def test_a_repair_runs_the_hooks_only_if_it_moved_the_hash(recorder: Recorder) -> None:
    run_id = _claimed()

    first = settle(run_id, TASK, RunState.COMPLETED, fenced=False, only_if_moved=True)
    second = settle(run_id, TASK, RunState.COMPLETED, fenced=False, only_if_moved=True)

    assert (first, second) == (True, False)
    assert len(recorder.heard) == 1


def test_a_missing_hash_is_no_error(recorder: Recorder) -> None:
    assert not settle(new_run_id(), TASK, RunState.FAILED)
    assert len(recorder.heard) == 1


def _counted(run_id: str) -> tuple[dict[str, int], int, dict[str, str]]:
    """What the end's script counted for TASK: runs by state, durations, today's day counts."""
    found = counters.read_all((counters.RUNS, counters.DURATION))
    runs = {labels[1]: int(n) for labels, n in found[counters.RUNS].items() if labels[0] == TASK}
    durations = int(found[counters.DURATION].get((TASK, "count"), 0))
    day = valkey.client().hgetall(keys.quota_counts(TASK, SYSTEM.now().date().isoformat()))
    return runs, durations, day


@pytest.fixture
def fresh_counts() -> None:
    client = valkey.client()
    client.delete(keys.metrics(counters.RUNS), keys.metrics(counters.DURATION))
    client.delete(keys.quota_counts(TASK, SYSTEM.now().date().isoformat()))


def _announced(run_id: str, end: Callable[[], object]) -> list[str]:
    """The messages on the run's ended channel while `end` runs."""
    listener = valkey.client().pubsub()
    listener.subscribe(keys.run_ended(run_id))
    try:
        confirmed = listener.get_message(timeout=2)
        assert confirmed is not None and confirmed["type"] == "subscribe"
        end()
        heard = []
        while (message := listener.get_message(timeout=0.2)) is not None:
            heard.append(message["data"])
        return heard
    finally:
        listener.close()


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_counts")
def test_the_move_counts_and_announces_the_end_once() -> None:
    run_id = _claimed()

    heard = _announced(run_id, lambda: settle(run_id, TASK, RunState.COMPLETED, owner=OWNER))
    # Settled again (a writer that re-sends its end): the hash is terminal, nothing counts.
    again = _announced(run_id, lambda: settle(run_id, TASK, RunState.COMPLETED, owner=OWNER))

    assert (heard, again) == (["completed"], [])
    assert _counted(run_id) == ({"completed": 1}, 1, {"completed": "1"})


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_counts")
def test_a_lost_hash_is_counted_without_a_duration_and_announced() -> None:
    run_id = new_run_id()

    heard = _announced(run_id, lambda: settle(run_id, TASK, RunState.FAILED))

    assert heard == ["failed"]
    assert _counted(run_id) == ({"failed": 1}, 0, {"failed": "1"})


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_counts")
def test_a_cancel_in_two_steps_counts_once_and_not_in_the_day() -> None:
    run_id = _claimed()

    heard = _announced(run_id, lambda: settle(run_id, TASK, RunState.CANCELLED, owner=OWNER))

    assert heard == ["cancelled"]
    assert _counted(run_id) == ({"cancelled": 1}, 1, {})


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_counts")
def test_a_fenced_end_leaves_the_count_to_the_move() -> None:
    run_id = _claimed()

    settle(run_id, TASK, RunState.COMPLETED, owner="host:2:LATE")
    assert _counted(run_id) == ({}, 0, {})
    # The repair moves the hash later, and counts it then.
    assert settle(run_id, TASK, RunState.COMPLETED, fenced=False, only_if_moved=True)
    assert _counted(run_id) == ({"completed": 1}, 1, {"completed": "1"})


# A task no other test ends runs of, so its circuit hash is this test's alone.
QUIET_TASK = "test-solo"


@dataclass
class Excusable(Recorder):
    """A hook the end's script may excuse, as it does the circuit."""

    name: str = "excusable"
    excused_at_end: ClassVar[bool] = True


@pytest.fixture
def excusable() -> Iterator[Excusable]:
    """Only this hook in the chain, and QUIET_TASK's circuit hash put back afterwards."""
    chain = dispatch.installed()
    hook = Excusable()
    dispatch.install((hook,))
    client = valkey.client()
    kept = client.hgetall(keys.circuit(QUIET_TASK))
    try:
        yield hook
    finally:
        dispatch.install(chain)
        client.delete(keys.circuit(QUIET_TASK))
        if kept:
            client.hset(keys.circuit(QUIET_TASK), mapping=kept)


CLEAN = {"state": "closed", "consecutive": "0"}


@pytest.mark.parametrize(
    ("target", "circuit", "told"),
    [
        (RunState.COMPLETED, CLEAN, False),
        (RunState.COMPLETED, {"state": "closed", "consecutive": "2"}, True),
        (RunState.COMPLETED, {"state": "open", "consecutive": "5"}, True),
        (RunState.COMPLETED, None, True),
        (RunState.FAILED, CLEAN, True),
        (RunState.CANCELLED, CLEAN, True),
    ],
    ids=["completed-clean", "after-failures", "open", "no-hash", "failed", "cancelled"],
)
def test_the_end_script_excuses_a_hook_only_from_an_end_that_changes_nothing(
    excusable: Excusable, target: RunState, circuit: dict[str, str] | None, told: bool
) -> None:
    client = valkey.client()
    client.delete(keys.circuit(QUIET_TASK))
    if circuit is not None:
        client.hset(keys.circuit(QUIET_TASK), mapping=circuit)
    run_id = new_run_id()
    live.seed(run_id, QUIET_TASK, 5, ())
    live.claim(run_id, OWNER, live.NO_PAUSE)

    assert settle(run_id, QUIET_TASK, target, owner=OWNER)
    assert live.read(run_id)["state"] == target.value
    assert [o.run_id for o in excusable.heard] == ([run_id] if told else [])


def test_a_lost_hash_tells_an_excusable_hook(excusable: Excusable) -> None:
    client = valkey.client()
    client.delete(keys.circuit(QUIET_TASK))
    client.hset(keys.circuit(QUIET_TASK), mapping=CLEAN)
    run_id = new_run_id()  # no hash: the script cannot read the circuit for it

    assert not settle(run_id, QUIET_TASK, RunState.COMPLETED)
    assert [o.run_id for o in excusable.heard] == [run_id]
