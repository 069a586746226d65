"""The dispatcher sends the hooks' Valkey commands at one point in one pipeline.

Counted at the connection (redis-py's, not ours): one send is one round trip, a pipeline
included. For a task with no limits every point costs one round trip to the coordination
Valkey (and admission at most one broker read for the depth), not one per hook.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from redis.connection import AbstractConnection

from orchestrator.hooks import dispatch
from orchestrator.hooks.base import Admission, Outcome, Pickup, Postpone, RunHook
from orchestrator.runs.admission import admit
from orchestrator.runs.start import new_run_id
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from tasks import registry

pytestmark = [pytest.mark.django_db(transaction=True)]

PLAIN = "test-rt-plain"  # no limits; no shared worker takes its queue
LIMITED = "test-rt-limited"  # max_concurrent=2, rate 1000/s


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    counted: Counter[str] = Counter()
    send = AbstractConnection.send_packed_command
    coordination = valkey.client().connection_pool.connection_kwargs.get("db", 0)

    def counting(self: AbstractConnection, command: object, check_health: bool = True) -> None:
        counted["coordination" if self.db == coordination else "other"] += 1
        send(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    yield counted


@pytest.fixture
def statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def _warm(task_id: str) -> None:
    """Connections open, scripts loaded and the circuit hash created, as in a process that
    started runs before."""
    definition = registry.get()[task_id]
    run_id = new_run_id()
    with transaction.atomic():
        admit(Admission(definition, run_id, "", 2, {"kind": "manual"}))
    dispatch.before_claim(Pickup(definition, run_id, "warm"))
    plan = dispatch.plan(definition)
    outcome = Outcome(definition, run_id, "warm", RunState.COMPLETED)
    dispatch.finished(outcome, plan.finished + plan.finished_asked)


def test_each_point_is_one_round_trip_for_a_task_without_limits(
    sends: Counter[str], statements: list[str]
) -> None:
    definition = registry.get()[PLAIN]
    _warm(PLAIN)
    sends.clear()
    statements.clear()
    run_id = new_run_id()

    with transaction.atomic():
        admit(Admission(definition, run_id, "", 2, {"kind": "manual"}))
    admitted = dict(sends)
    sends.clear()
    dispatch.before_claim(Pickup(definition, run_id, "owner"))
    picked = dict(sends)
    sends.clear()
    plan = dispatch.plan(definition)
    outcome = Outcome(definition, run_id, "owner", RunState.COMPLETED)
    dispatch.finished(outcome, plan.finished + plan.finished_asked)
    ended = dict(sends)

    # Admission: the admission script (pause, circuit, day count) alone; the broker depth on
    # its own server, unless the warm-up's reading is still fresh (`admission.DEPTH_FRESH`).
    assert admitted.pop("coordination") == 1
    assert admitted in ({"other": 1}, {})
    # Pickup: no hook (the claim's own script reads the pauses; no max_concurrent, so no slot
    # to take; only a circuit's probe asks about its slot).
    assert picked == {}
    # End, the circuit told (the end's script excuses it from a clean completion,
    # `test_settle.py`): its record alone, the day count being the end script's.
    assert ended == {"coordination": 1}
    assert statements == []  # no quota row per start or end


def test_a_run_the_concurrency_limit_postpones_takes_no_rate_admission() -> None:
    definition = registry.get()[LIMITED]
    valkey.client().delete(keys.concurrency_holders(LIMITED), keys.rate_window(LIMITED))
    for holder in ("run_a", "run_b"):
        dispatch.before_claim(Pickup(definition, holder, "owner"))

    with pytest.raises(Postpone):
        dispatch.before_claim(Pickup(definition, "run_c", "owner"))

    admitted = valkey.client().zrange(keys.rate_window(LIMITED), 0, -1)
    assert sorted(admitted) == ["run_a|owner", "run_b|owner"]


def _names(hooks: tuple[RunHook, ...]) -> list[str]:
    return [hook.name for hook in hooks]


# The hooks every task's runs go through, whatever it declares: a task can be paused, has a
# circuit, counts its runs per day, is judged by its class's queue depth, and its end is
# counted for /metrics and told to its waiters.
UNIVERSAL = ["pause", "circuit"]


def test_a_task_that_declares_nothing_runs_none_of_the_limits_hooks() -> None:
    """Compiled plans: no identity, limit, rate or cost cap, so dedup, concurrency, rate and
    cost are in none of its points, and its heartbeat has no hook at all."""
    plan = dispatch.plan(registry.get()[PLAIN])

    assert _names(plan.hooks()) == UNIVERSAL
    # The admission script reads the pause and the circuit, and counts the day (an uncapped
    # task's quota has no point at all): they judge a start only when it asks. The queue cap
    # is no hook (`runs.admission`): no admission hook at all runs for this task's starts.
    assert plan.admit == ()
    assert _names(plan.admit_all) == ["pause", "circuit"]
    assert plan.before_claim == plan.finished == ()
    assert _names(plan.before_claim_noted) == ["circuit"]  # a probe's message only
    assert _names(plan.finished_asked) == ["circuit"]  # when the end's script asks
    assert plan.heartbeat == plan.release == plan.republished == ()
    assert _names(plan.abandoned) == ["circuit"]
    assert plan is dispatch.plan(registry.get()[PLAIN]), "compiled once per definition"


def test_a_task_with_every_limit_runs_every_hook_in_chain_order() -> None:
    limited = registry.get()[LIMITED]
    # test-rt-limited declares no cost cap (its start would read Postgres for it): one is added.
    # ...and a named limit.
    capped = dataclasses.replace(
        limited,
        quotas=dataclasses.replace(limited.quotas, max_cost_per_day={"tokens": 1e9}),
        limits=("test-one-at-a-time",),
    )

    # Every hook but the throttle (a task debounces, throttles or neither: issue 39) and the
    # keyed concurrency (a task limits its runs at once one way: its max_concurrent here).
    assert _names(dispatch.plan(capped).hooks()) == [
        name for name in _names(dispatch.installed()) if name not in ("throttle", "keyed")
    ]
    assert _names(dispatch.plan(limited).hooks()) == [
        name
        for name in _names(dispatch.installed())
        if name not in ("cost-quota", "throttle", "keyed", "limits")
    ]
    plan = dispatch.plan(limited)
    assert _names(plan.before_claim) == ["concurrency", "rate"]
    assert _names(plan.before_claim_noted) == ["circuit", "concurrency", "rate"]
    assert _names(plan.release) == ["concurrency", "rate"]
    assert _names(plan.heartbeat) == ["concurrency"]
    assert _names(plan.republished) == ["dedup"]
    assert dispatch.plan(capped) is not dispatch.plan(capped), "not the registry's: not kept"


def test_a_chain_or_a_registry_installed_again_compiles_plans_again() -> None:
    definition = registry.get()[PLAIN]
    chain = dispatch.installed()
    before = dispatch.plan(definition)
    pause_alone = tuple(hook for hook in chain if hook.name == "pause")
    dispatch.install(pause_alone)
    try:
        assert dispatch.plan(definition).hooks() == pause_alone
    finally:
        dispatch.install(chain)
    again = dispatch.plan(definition)
    assert again is not before and again.hooks() == before.hooks()
    # A registry installed again (a test's): its definitions' plans are compiled against it
    # (dedup's scope reads the registry's exclusive groups).
    installed = registry.get()
    registry.install(
        registry.Registry(
            installed.values(), installed.triggers.values(), installed.limits.values()
        )
    )
    try:
        assert dispatch.plan(definition) is not again
    finally:
        registry.install(installed)
