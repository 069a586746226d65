"""The per-task circuit breaker on real Postgres and Valkey, driven by a FrozenClock.

Hook-level tests call a `CircuitBreaker(clock=...)` directly with the Admission/Outcome
objects start_run and the runner build; the last test runs real failures on a worker through
the shared hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from threading import Barrier

import pytest
from django.db import connection, transaction

from orchestrator.clock import SYSTEM, FrozenClock
from orchestrator.hooks.base import Admission, Outcome, Pickup, run_alone
from orchestrator.hooks.circuit import (
    PROBE_PROVISIONAL_TTL,
    CircuitBreaker,
    CircuitOpen,
    force_enable,
    status,
    statuses,
)
from orchestrator.models import CircuitState, TaskCircuitState, TaskHistory, TaskQuotaUsage
from orchestrator.runs.start import after_insert, new_run_id, start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tasks.errors import ErrorKind
from tasks.registry import UnknownTaskError
from tests.support.fixtures import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-circuit"
MINUTE = timedelta(minutes=1)
HARD_TIMEOUT = timedelta(minutes=30)  # test-circuit keeps the default timeout


@pytest.fixture(autouse=True)
def _fresh_circuit() -> Iterator[None]:
    # The hash has no TTL and Redis is shared by the whole session: start and end without it.
    client = valkey.client()
    client.delete(keys.circuit(TASK), keys.circuit("test-noop"))
    yield
    client.delete(keys.circuit(TASK), keys.circuit("test-noop"))


@pytest.fixture
def clock() -> FrozenClock:
    # Anchored at the real time (whole ms), so a start_run through the shared hooks, which
    # read the system clock, sees the same circuit until the test moves this clock on.
    now = SYSTEM.now()
    return FrozenClock(now.replace(microsecond=now.microsecond // 1000 * 1000))


@pytest.fixture
def breaker(clock: FrozenClock) -> CircuitBreaker:
    return CircuitBreaker(clock=clock)


def _admission(task_id: str = TASK) -> Admission:
    return Admission(registry.get()[task_id], new_run_id(), "identity", 5, {"kind": "manual"})


def _admit(breaker: CircuitBreaker) -> str:
    """A start through the breaker, inserted: what it asks for once it commits is registered
    as `start_run` does (`runs.start.after_insert`)."""
    admission = _admission()
    run_alone(breaker.plan_admit(admission))
    after_insert(admission)
    return admission.run_id


def _end(
    breaker: CircuitBreaker,
    run_id: str,
    state: RunState = RunState.FAILED,
    kind: ErrorKind | None = ErrorKind.FATAL,
    *,
    final: bool = True,
) -> None:
    run_alone(
        breaker.plan_finished(
            Outcome(registry.get()[TASK], run_id, "test-owner", state, kind, final)
        )
    )


def _fail(breaker: CircuitBreaker, times: int = 1, kind: ErrorKind = ErrorKind.FATAL) -> None:
    for _ in range(times):
        _end(breaker, _admit(breaker), kind=kind)


def _succeed(breaker: CircuitBreaker) -> None:
    _end(breaker, _admit(breaker), RunState.COMPLETED, None)


def _refusal(breaker: CircuitBreaker) -> CircuitOpen:
    with pytest.raises(CircuitOpen) as refused:
        run_alone(breaker.plan_admit(_admission()))
    return refused.value


def _hash() -> dict[str, str]:
    return valkey.client().hgetall(keys.circuit(TASK))


def test_full_cycle_open_probe_reopen_close(breaker: CircuitBreaker, clock: FrozenClock) -> None:
    _fail(breaker, 4)
    assert status(TASK, clock=clock).state == CircuitState.CLOSED
    assert status(TASK, clock=clock).consecutive_failures == 4

    _fail(breaker)

    opened = status(TASK, clock=clock)
    assert opened.state == CircuitState.OPEN
    assert opened.time_to_half_open == MINUTE
    assert opened.half_open_at == clock.now() + MINUTE
    # start_run goes through the shared hooks: refused before the quota takes a unit.
    with pytest.raises(CircuitOpen, match=r"^task 'test-circuit' refused: ") as refused:
        start_run(TASK, {"how": "fatal"}, trigger=TriggerKind.MANUAL)
    assert (refused.value.code, refused.value.http_status) == ("circuit_open", 503)
    assert refused.value.retry_after is not None
    assert timedelta(0) < refused.value.retry_after <= MINUTE
    assert f"half-opens at {(clock.now() + MINUTE).isoformat()}" in str(refused.value)
    assert not TaskHistory.objects.filter(task_id=TASK).exists()
    assert not TaskQuotaUsage.objects.filter(task_id=TASK).exists()
    assert _refusal(breaker).retry_after == MINUTE

    clock.advance(MINUTE)

    assert status(TASK, clock=clock).state == CircuitState.HALF_OPEN
    probe = _admit(breaker)
    busy = _refusal(breaker)
    assert f"probe run {probe} is testing it" in str(busy)
    assert busy.retry_after == MINUTE
    assert status(TASK, clock=clock).probe_run_id == probe

    _end(breaker, probe)

    reopened = status(TASK, clock=clock)
    assert (reopened.state, reopened.reopen_count) == (CircuitState.OPEN, 2)
    assert reopened.time_to_half_open == 5 * MINUTE
    assert _refusal(breaker).retry_after == 5 * MINUTE

    clock.advance(5 * MINUTE)
    probe = _admit(breaker)
    _refusal(breaker)
    _end(breaker, probe, RunState.COMPLETED, None)

    closed = status(TASK, clock=clock)
    assert closed.state == CircuitState.CLOSED
    assert (closed.consecutive_failures, closed.reopen_count) == (0, 0)
    assert closed.half_open_at is None and closed.probe_run_id is None
    for _ in range(3):
        _admit(breaker)
    # Everything was reset: it takes the full threshold again to open it.
    _fail(breaker, 4)
    assert status(TASK, clock=clock).state == CircuitState.CLOSED


def test_ten_failures_within_30_minutes_open_it_despite_successes(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    for _ in range(9):
        _fail(breaker)
        _succeed(breaker)
        clock.advance(3 * MINUTE)
    assert status(TASK, clock=clock).state == CircuitState.CLOSED
    assert status(TASK, clock=clock).consecutive_failures == 0

    _fail(breaker)  # the 10th, 27 minutes after the first

    assert status(TASK, clock=clock).state == CircuitState.OPEN


def test_failures_spread_over_more_than_30_minutes_do_not_open_it(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    for _ in range(30):
        _fail(breaker)
        _succeed(breaker)
        clock.advance(4 * MINUTE)

    assert status(TASK, clock=clock).state == CircuitState.CLOSED
    assert len(TaskCircuitState.objects.get(task_id=TASK).recent_failures) == 8


@pytest.mark.parametrize(
    "kind", [ErrorKind.FATAL, ErrorKind.INTERNAL, ErrorKind.TIMEOUT, ErrorKind.TRANSIENT]
)
def test_counted_kinds_open_it(
    breaker: CircuitBreaker, clock: FrozenClock, kind: ErrorKind
) -> None:
    _fail(breaker, 5, kind)

    assert status(TASK, clock=clock).state == CircuitState.OPEN


def test_outcomes_that_do_not_count_never_open_it_nor_reset_the_count(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _fail(breaker, 4)
    for _ in range(12):
        for kind in (ErrorKind.PERMANENT, ErrorKind.VALIDATION, ErrorKind.STALE_VERSION):
            _end(breaker, _admit(breaker), kind=kind)
        _end(breaker, _admit(breaker), RunState.CANCELLED, None)
        # An attempt that will be retried is not an outcome yet, whatever its kind.
        _end(breaker, _admit(breaker), kind=ErrorKind.TRANSIENT, final=False)
        _end(breaker, _admit(breaker), kind=ErrorKind.FATAL, final=False)

    assert status(TASK, clock=clock).state == CircuitState.CLOSED
    assert status(TASK, clock=clock).consecutive_failures == 4

    _fail(breaker)
    assert status(TASK, clock=clock).state == CircuitState.OPEN


def test_a_failure_reported_twice_counts_once(breaker: CircuitBreaker, clock: FrozenClock) -> None:
    _fail(breaker, 3)
    run_id = _admit(breaker)
    for _ in range(3):
        _end(breaker, run_id)

    assert status(TASK, clock=clock).state == CircuitState.CLOSED
    assert status(TASK, clock=clock).consecutive_failures == 4


def test_backoff_steps_then_saturates_at_two_hours(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _fail(breaker, 5)
    steps = []
    for _ in range(6):
        wait = status(TASK, clock=clock).time_to_half_open
        assert wait is not None
        steps.append(wait)
        clock.advance(wait)
        _end(breaker, _admit(breaker), kind=ErrorKind.TIMEOUT)

    assert steps == [MINUTE, 5 * MINUTE, 30 * MINUTE, 120 * MINUTE, 120 * MINUTE, 120 * MINUTE]
    assert status(TASK, clock=clock).reopen_count == 7


def _half_open(breaker: CircuitBreaker, clock: FrozenClock) -> None:
    _fail(breaker, 5)
    clock.advance(MINUTE)


def test_a_probe_that_never_reports_frees_its_slot_after_the_hard_timeout(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _half_open(breaker, clock)
    lost = _admit(breaker)

    clock.advance(HARD_TIMEOUT - timedelta(milliseconds=1))
    assert status(TASK, clock=clock).probe_run_id == lost
    _refusal(breaker)
    clock.advance(timedelta(milliseconds=1))
    assert status(TASK, clock=clock).probe_run_id is None
    second = _admit(breaker)

    assert status(TASK, clock=clock).probe_run_id == second
    _refusal(breaker)
    # The lost probe reporting late counts like any run, and decides nothing.
    _end(breaker, lost, RunState.COMPLETED, None)
    assert status(TASK, clock=clock).state == CircuitState.HALF_OPEN
    _end(breaker, second, RunState.COMPLETED, None)
    assert status(TASK, clock=clock).state == CircuitState.CLOSED


def test_a_probe_whose_start_rolled_back_holds_the_slot_only_briefly(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _half_open(breaker, clock)
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = _admit(breaker)
        raise RuntimeError("caller aborts")

    assert status(TASK, clock=clock).probe_run_id == rolled_back
    assert TaskCircuitState.objects.get(task_id=TASK).state == CircuitState.OPEN
    clock.advance(PROBE_PROVISIONAL_TTL)
    probe = _admit(breaker)
    assert status(TASK, clock=clock).probe_run_id == probe


def test_claiming_the_probe_gives_it_a_whole_hard_timeout(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _half_open(breaker, clock)
    admission = _admission()
    run_alone(breaker.plan_admit(admission))
    # Its message carries the note (`runs.publish.HOOK_HEADER`) back to the pickup.
    notes = admission.notes
    assert notes

    clock.advance(20 * MINUTE)  # waiting in its queue
    run_alone(
        breaker.plan_before_claim(
            Pickup(admission.definition, admission.run_id, "test-owner", notes)
        )
    )
    clock.advance(HARD_TIMEOUT - timedelta(milliseconds=1))

    assert status(TASK, clock=clock).probe_run_id == admission.run_id
    _refusal(breaker)


def test_only_the_probe_asks_valkey_at_pickup(breaker: CircuitBreaker, clock: FrozenClock) -> None:
    closed = _admission()
    run_alone(breaker.plan_admit(closed))
    assert closed.notes == {}
    assert breaker.plan_before_claim(Pickup(closed.definition, closed.run_id, "owner")) is None


def test_a_probe_without_a_verdict_frees_the_slot_for_another(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _half_open(breaker, clock)
    cancelled = _admit(breaker)
    _end(breaker, cancelled, RunState.CANCELLED, None)

    assert status(TASK, clock=clock).state == CircuitState.HALF_OPEN
    permanent = _admit(breaker)
    _end(breaker, permanent, kind=ErrorKind.PERMANENT)
    abandoned = _admission()
    run_alone(breaker.plan_admit(abandoned))
    breaker.abandoned(abandoned)  # a later hook refused the start

    final = _admit(breaker)
    assert status(TASK, clock=clock).probe_run_id == final


def test_exactly_one_of_many_concurrent_starts_is_the_probe(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _half_open(breaker, clock)
    starts = 16
    barrier = Barrier(starts)

    def attempt() -> bool:
        try:
            barrier.wait()
            run_alone(breaker.plan_admit(_admission()))
            return True
        except CircuitOpen:
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(starts) as pool:
        admitted = list(pool.map(lambda _: attempt(), range(starts)))

    assert admitted.count(True) == 1


def test_force_enable_admits_until_it_expires(breaker: CircuitBreaker, clock: FrozenClock) -> None:
    _fail(breaker, 5)
    ttl = timedelta(days=1)  # LUMASTRA_CIRCUIT_FORCE_ENABLE_TTL_S's default

    forced = force_enable(TASK, actor="ops@example.org", clock=clock)

    assert forced.state == CircuitState.CLOSED
    assert (forced.forced_until, forced.forced_by) == (clock.now() + ttl, "ops@example.org")
    _fail(breaker, 12)  # counted, but it stays closed: more than both rules would allow
    during = status(TASK, clock=clock)
    assert (during.state, during.consecutive_failures) == (CircuitState.CLOSED, 12)
    assert TaskCircuitState.objects.get(task_id=TASK).forced_by == "ops@example.org"

    clock.advance(ttl)

    after = status(TASK, clock=clock)
    assert (after.forced_until, after.forced_by) == (None, None)
    _admit(breaker)
    _fail(breaker)  # the normal rules again, on the counts gathered meanwhile
    assert status(TASK, clock=clock).state == CircuitState.OPEN
    assert status(TASK, clock=clock).time_to_half_open == MINUTE


def test_force_enable_refuses_unknown_tasks_and_anonymous_operators(clock: FrozenClock) -> None:
    with pytest.raises(UnknownTaskError):
        force_enable("no-such-task", actor="ops", clock=clock)
    with pytest.raises(ValueError, match="operator"):
        force_enable(TASK, actor=" ", clock=clock)


def test_the_postgres_row_matches_the_valkey_hash(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    _fail(breaker, 3)
    _succeed(breaker)
    _fail(breaker, 5)
    clock.advance(MINUTE)
    _admit(breaker)  # the probe: half-open is copied to Postgres once its start commits

    held = _hash()
    row = TaskCircuitState.objects.get(task_id=TASK)

    assert row.state == held["state"] == CircuitState.HALF_OPEN
    assert row.consecutive_failures == int(held["consecutive"]) == 5
    assert row.reopen_count == int(held["reopen_count"]) == 1
    assert valkey.to_ms(row.opened_at) == int(held["opened_at"])
    assert valkey.to_ms(row.half_open_at) == int(held["half_open_at"])
    assert row.forced_until is None and held["forced_until"] == ""
    assert row.version == int(held["version"])
    assert valkey.to_ms(row.updated_at) == int(held["updated_at"]) == valkey.to_ms(clock.now())
    assert [f"{e['at']}:{e['run']}" for e in row.recent_failures] == held["recent"].split(",")
    assert len(row.recent_failures) == 8


def test_a_lost_hash_is_rebuilt_from_postgres(breaker: CircuitBreaker, clock: FrozenClock) -> None:
    # Nine failures in the window, then the circuit opens; both survive Valkey losing the hash.
    for _ in range(4):
        _fail(breaker)
        _succeed(breaker)
    _fail(breaker, 5)
    before = _hash()
    valkey.client().delete(keys.circuit(TASK))

    shown = status(TASK, clock=clock)  # read-only: shown from the Postgres row, not written back
    assert shown.state == CircuitState.OPEN and shown.time_to_half_open == MINUTE
    assert not valkey.client().exists(keys.circuit(TASK))
    assert _refusal(breaker).retry_after == MINUTE
    rebuilt = _hash()
    assert {k: v for k, v in rebuilt.items() if not k.startswith("probe")} == {
        k: v for k, v in before.items() if not k.startswith("probe")
    }

    clock.advance(MINUTE)
    probe = _admit(breaker)
    _end(breaker, probe, RunState.COMPLETED, None)
    assert status(TASK, clock=clock).state == CircuitState.CLOSED
    assert TaskCircuitState.objects.get(task_id=TASK).state == CircuitState.CLOSED


def test_a_task_without_a_postgres_row_starts_closed(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    assert statuses([TASK, "test-noop"], clock=clock)[TASK].state == CircuitState.CLOSED

    run_alone(breaker.plan_admit(_admission("test-noop")))

    assert valkey.client().hget(keys.circuit("test-noop"), "state") == "closed"
    assert not TaskCircuitState.objects.exists(), "admitting to a closed circuit writes nothing"


def test_a_valkey_that_lost_its_scripts_and_the_hash_still_admits(
    breaker: CircuitBreaker, clock: FrozenClock
) -> None:
    # A restart without AOF: no script loaded (NOSCRIPT in the pipeline), no circuit hash.
    valkey.client().script_flush()
    valkey.client().delete(keys.circuit(TASK))

    run_alone(breaker.plan_admit(_admission()))

    assert valkey.client().hget(keys.circuit(TASK), "state") == "closed"


@pytest.mark.worker
def test_fatal_failures_on_a_worker_open_the_circuit(celery_worker: object) -> None:
    runs = [start_run(TASK, {"how": "fatal"}, trigger=TriggerKind.MANUAL) for _ in range(5)]

    wait_for(lambda: status(TASK).state == CircuitState.OPEN)

    with pytest.raises(CircuitOpen, match=r"^task 'test-circuit' refused: ") as refused:
        start_run(TASK, {"how": "fatal"}, trigger=TriggerKind.MANUAL)
    assert refused.value.retry_after is not None
    assert timedelta(0) < refused.value.retry_after <= MINUTE
    rows = TaskHistory.objects.filter(task_id=TASK)
    assert {row.id for row in rows} == {run.run_id for run in runs}
    assert {(row.state, row.error["kind"]) for row in rows} == {("failed", "fatal")}
    stored = TaskCircuitState.objects.get(task_id=TASK)
    assert (stored.state, stored.consecutive_failures) == (CircuitState.OPEN, 5)
    assert stored.half_open_at is not None
    assert stored.half_open_at - stored.opened_at == MINUTE
