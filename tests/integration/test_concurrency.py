"""max_concurrent holds across worker processes, measured by the runs themselves; a crashed
holder's slot comes back when its lease runs out, and not before."""

from __future__ import annotations

import json
import os
import signal

import pytest
from django.conf import settings

from orchestrator.hooks import concurrency, dispatch
from orchestrator.hooks.base import Outcome, Pickup, Postpone, run_alone
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.task_defs import LEASE_STARTS_KEY, LIMITED_NOW_KEY, LIMITED_SEEN_KEY

pytestmark = [pytest.mark.django_db(transaction=True)]


def _server_ms() -> int:
    seconds, micros = valkey.client().time()
    return int(seconds) * 1000 + int(micros) // 1000


def _clear(task_id: str, *extra: str) -> None:
    valkey.client().delete(
        keys.concurrency_holders(task_id),
        keys.concurrency_waiters(task_id),
        keys.concurrency_postponed(task_id),
        *extra,
    )


def _completed(task_id: str) -> int:
    return TaskHistory.objects.filter(task_id=task_id, state=RunState.COMPLETED).count()


@pytest.mark.worker
def test_max_concurrent_is_never_exceeded_across_two_workers() -> None:
    _clear("test-limited", LIMITED_NOW_KEY, LIMITED_SEEN_KEY)
    queue = queue_name(registry.get()["test-limited"], settings.CONFIG.per_task_queues)
    runs = 30

    # Four processes in all, two per worker, for a limit of two.
    with (
        worker_process([queue], concurrency=2, name="limited-a") as first,
        worker_process([queue], concurrency=2, name="limited-b") as second,
    ):
        # Both workers are up before the first start, so both take part from the beginning.
        for index in range(runs):
            start_run("test-limited", {"label": f"r{index}"}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _completed("test-limited") == runs, timeout=180)

    client = valkey.client()
    seen = [json.loads(entry) for entry in client.lrange(LIMITED_SEEN_KEY, 0, -1)]
    assert len(seen) == runs, "every run entered its handler exactly once"
    concurrency_seen = [now for now, _ in seen]
    assert max(concurrency_seen) == 2, f"the limit is 2; runs saw {concurrency_seen}"
    assert {worker for _, worker in seen} == {first.pid, second.pid}
    assert client.get(LIMITED_NOW_KEY) == "0"
    assert client.zcard(keys.concurrency_holders("test-limited")) == 0, "every slot was given back"


@pytest.mark.worker
def test_a_killed_holders_run_is_put_back_and_frees_its_slot() -> None:
    definition = registry.get()["test-lease"]
    _clear("test-lease", LEASE_STARTS_KEY)
    client = valkey.client()
    queue = queue_name(definition, settings.CONFIG.per_task_queues)

    with worker_process([queue], concurrency=2, name="lease"):
        victim = start_run(
            "test-lease", {"label": "victim", "seconds": 2.5}, trigger=TriggerKind.MANUAL
        )
        started = wait_for(lambda: client.hget(LEASE_STARTS_KEY, "victim"))
        ((holder, lease_end),) = client.zrange(
            keys.concurrency_holders("test-lease"), 0, -1, withscores=True
        )
        assert holder.startswith(f"{victim.run_id}|")
        follower = start_run(
            "test-lease", {"label": "follower", "seconds": 0.1}, trigger=TriggerKind.MANUAL
        )
        os.kill(json.loads(started)["pid"], signal.SIGKILL)

        wait_for(lambda: _completed("test-lease") == 2, timeout=60)

    # The redelivered message found its owner dead on this host: the run went back to pending
    # at once (its next attempt, `runs.put_back`) and gave its slot back, long before the lease
    # would have run out; its second attempt completed.
    killed = TaskHistory.objects.get(id=victim.run_id)
    assert (killed.state, killed.attempts) == (RunState.COMPLETED, 2)
    follower_start = json.loads(client.hget(LEASE_STARTS_KEY, "follower"))["at_ms"]
    assert follower_start < lease_end
    assert TaskHistory.objects.get(id=follower.run_id).state == RunState.COMPLETED
    assert client.zcard(keys.concurrency_holders("test-lease")) == 0


def _pickup(run_id: str, owner: str = "test-owner") -> Pickup:
    return Pickup(registry.get()["test-lease"], run_id, owner)


def test_an_expired_lease_is_taken_over_and_a_live_one_is_not() -> None:
    _clear("test-lease")
    holders = keys.concurrency_holders("test-lease")
    client = valkey.client()
    hook = concurrency.ConcurrencyLimit()
    client.zadd(holders, {concurrency.holder("run_ghost", "dead-host:1:x"): _server_ms() - 1})

    run_alone(hook.plan_before_claim(_pickup("run_a")))
    with pytest.raises(Postpone) as waited:
        run_alone(hook.plan_before_claim(_pickup("run_b")))

    assert client.zrange(holders, 0, -1) == [concurrency.holder("run_a", "test-owner")]
    assert "limit of 1" in waited.value.reason
    delay = waited.value.delay.total_seconds()
    assert 0.4 <= delay <= 0.6, "the head of the line asks again after about half a second"


def test_a_held_slot_is_kept_by_its_holder_and_given_back_once() -> None:
    _clear("test-lease")
    hook = concurrency.ConcurrencyLimit()
    run_alone(hook.plan_before_claim(_pickup("run_a")))
    run_alone(
        hook.plan_before_claim(_pickup("run_a"))
    )  # the same delivery asking again keeps its one slot

    # A second delivery of run_a in another process is a different holder: it must wait, and
    # giving its (untaken) slot back must not free the first delivery's.
    with pytest.raises(Postpone):
        run_alone(hook.plan_before_claim(_pickup("run_a", owner="other-process")))
    hook.release(_pickup("run_a", owner="other-process"))
    with pytest.raises(Postpone):
        run_alone(hook.plan_before_claim(_pickup("run_b")))

    hook.release(_pickup("run_a"))
    run_alone(hook.plan_before_claim(_pickup("run_b")))


def test_waiters_keep_their_place_and_back_off_further_back() -> None:
    _clear("test-lease")
    waiters = keys.concurrency_waiters("test-lease")
    client = valkey.client()
    hook = concurrency.ConcurrencyLimit()
    run_alone(hook.plan_before_claim(_pickup("run_holder")))

    delays: dict[str, list[float]] = {"run_first": [], "run_second": []}
    for _ in range(6):
        for run_id, seen in delays.items():
            with pytest.raises(Postpone) as waited:
                run_alone(hook.plan_before_claim(_pickup(run_id)))
            seen.append(waited.value.delay.total_seconds())

    assert client.zrange(waiters, 0, -1) == ["run_first", "run_second"]
    assert client.hget(keys.concurrency_postponed("test-lease"), "run_second").startswith("6:")
    # Each postponement waits longer (with ±20 % jitter): up to 1 s for the head of the line,
    # which is due for the next slot, and up to 3 s behind it.
    first, second = delays["run_first"], delays["run_second"]
    assert 0.4 <= first[0] <= 0.6 and 0.8 <= first[-1] <= 1.2
    assert max(first) <= 1.2
    assert 0.4 <= second[0] <= 0.6 and 2.4 <= second[-1] <= 3.6

    hook.release(_pickup("run_holder"))
    run_alone(hook.plan_before_claim(_pickup("run_first")))
    assert client.zrange(waiters, 0, -1) == ["run_second"]
    assert not client.hexists(keys.concurrency_postponed("test-lease"), "run_first")


def test_a_waiter_that_stopped_coming_back_leaves_the_front_of_the_line() -> None:
    _clear("test-lease")
    waiters = keys.concurrency_waiters("test-lease")
    postponed = keys.concurrency_postponed("test-lease")
    client = valkey.client()
    hook = concurrency.ConcurrencyLimit()
    run_alone(hook.plan_before_claim(_pickup("run_holder")))
    stale_ms = concurrency.STALE_AFTER.total_seconds() * 1000
    last_seen = _server_ms() - int(stale_ms) - 1
    client.zadd(waiters, {"run_gone": last_seen - 5_000})
    client.hset(postponed, "run_gone", f"3:{last_seen}")

    with pytest.raises(Postpone) as waited:
        run_alone(hook.plan_before_claim(_pickup("run_new")))

    assert "0 waiting ahead" in waited.value.reason
    assert client.zrange(waiters, 0, -1) == ["run_new"]
    assert not client.hexists(postponed, "run_gone")


def test_the_heartbeat_renews_a_live_lease_and_never_revives_a_lost_one() -> None:
    """The lease is renewed at the dispatcher's heartbeat point (`runs.watch` beats), for the
    slot this run's delivery took."""
    _clear("test-lease")
    holders = keys.concurrency_holders("test-lease")
    client = valkey.client()
    run_id, owner = "run_refreshed", "refresh-owner"
    member = concurrency.holder(run_id, owner)
    definition = registry.get()["test-lease"]

    def beat() -> None:
        dispatch.heartbeat(definition, run_id, owner)

    beat()
    assert client.zscore(holders, member) is None, "no slot taken yet: none is made"
    run_alone(concurrency.ConcurrencyLimit().plan_before_claim(_pickup(run_id, owner)))
    client.zadd(holders, {member: _server_ms() + 1_000})
    beat()
    lease_ms = concurrency.lease_of(definition).total_seconds() * 1000
    assert client.zscore(holders, member) >= _server_ms() + lease_ms - 1_000

    client.zadd(holders, {member: _server_ms() - 1})
    beat()
    assert client.zscore(holders, member) is None, "a lease that ran out is never revived"


def test_a_task_without_max_concurrent_takes_no_slot() -> None:
    """No default limit: one host's pool budget made cluster-wide held a cpu task to one run at
    a time on 2 cores. Its runs send nothing to the semaphore, at pickup or at the end."""
    noop = registry.get()["test-noop"]
    _clear(noop.id)
    hook = concurrency.ConcurrencyLimit()
    pickup = Pickup(noop, "run_a", "test-owner")

    assert noop.quotas.max_concurrent is None and concurrency.limit_of(noop) is None
    assert not hook.applies(noop)
    assert not any(isinstance(h, concurrency.ConcurrencyLimit) for h in dispatch.plan(noop).hooks())
    assert hook.plan_before_claim(pickup) is None
    assert hook.plan_finished(Outcome(noop, "run_a", "test-owner", RunState.COMPLETED)) is None
    for run_id in ("run_a", "run_b", "run_c"):  # as many as ask: the pools bound them
        run_alone(hook.plan_before_claim(Pickup(noop, run_id, "test-owner")))
    assert not valkey.client().exists(keys.concurrency_holders(noop.id))
    assert concurrency.limit_of(registry.get()["test-limited"]) == 2
