"""Cancellation: before pickup, cooperative while running, escalated to a kill, and retry; and
the cancel channels: one per worker process, named by its instance id (`keys.cancel_channel`),
subscribed once by its run watch whatever the number of runs, each message naming its run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs.cancel import NotCancellable, UnknownRun, request_cancel
from orchestrator.runs.rerun import NotRetryable, rerun
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import broker, durable, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.processes import alive
from tests.support.task_defs import SLEEPY_PIDS_KEY

pytestmark = [pytest.mark.django_db(transaction=True)]

QUEUE = "task.t.test-sleepy"
FAST = {"LUMASTRA_HEARTBEAT_INTERVAL_S": "1", "LUMASTRA_CANCEL_ESCALATE_S": "2"}
# Heartbeats and the escalation too slow to stop a handler within a test's wait: only a message
# on the cancel channel can (a cooperative sleep reads the hash only as it begins).
CHANNEL_ONLY = {"LUMASTRA_HEARTBEAT_INTERVAL_S": "30", "LUMASTRA_CANCEL_ESCALATE_S": "60"}


@pytest.fixture(autouse=True)
def _empty_queue() -> None:
    empty_queues(QUEUE)
    valkey.client().delete(SLEEPY_PIDS_KEY)


def _state(run_id: str) -> str:
    return TaskHistory.objects.get(id=run_id).state


def test_a_run_cancelled_before_pickup_ends_at_once_and_leaves_no_message() -> None:
    handle = start_run("test-sleepy", {"seconds": 5}, trigger=TriggerKind.MANUAL)
    assert broker.depth([QUEUE]) == 1

    assert request_cancel(handle.run_id, actor="ops") == "cancelled"

    row = TaskHistory.objects.get(id=handle.run_id)
    assert row.state == "cancelled" and row.error["kind"] == "cancelled"
    assert "ops" in row.error["message"]
    assert live.read(handle.run_id)["state"] == "cancelled"
    assert broker.depth([QUEUE]) == 0
    with pytest.raises(NotCancellable, match="already ended"):
        request_cancel(handle.run_id, actor="ops")
    with pytest.raises(UnknownRun):
        request_cancel("run_nope", actor="ops")


@pytest.mark.worker
def test_a_running_handler_stops_cooperatively() -> None:
    with worker_process([QUEUE], concurrency=1, name="cancel", env=FAST):
        handle = start_run("test-sleepy", {"seconds": 60}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: valkey.client().hexists(SLEEPY_PIDS_KEY, handle.run_id))
        asked = time.monotonic()

        assert request_cancel(handle.run_id, actor="ops") == "cancelling"
        assert live.read(handle.run_id)["state"] == "cancelling"
        wait_for(lambda: _state(handle.run_id) == "cancelled", timeout=10)
        # The channel tripped ctx.sleep well before the 2 s escalation would have.
        assert time.monotonic() - asked < 2
        assert alive(int(valkey.client().hget(SLEEPY_PIDS_KEY, handle.run_id)))  # not killed

    assert live.read(handle.run_id)["state"] == "cancelled"


@pytest.mark.worker
def test_a_deaf_handler_is_killed_after_the_escalation_delay() -> None:
    with worker_process([QUEUE], concurrency=1, name="escalate", env=FAST):
        deaf = start_run(
            "test-sleepy", {"seconds": 60, "cooperative": False}, trigger=TriggerKind.MANUAL
        )
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, deaf.run_id)))
        request_cancel(deaf.run_id, actor="ops")

        wait_for(lambda: _state(deaf.run_id) == "cancelled", timeout=15)
        wait_for(lambda: not alive(pid), timeout=10)
        # The pool replaced the killed child and keeps working.
        after = start_run("test-sleepy", {"seconds": 0}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _state(after.run_id) == "completed", timeout=20)

    assert live.read(deaf.run_id)["state"] == "cancelled"


def test_kill_now_ends_a_deaf_handler_without_waiting_for_the_escalation() -> None:
    slow_escalation = {**FAST, "LUMASTRA_CANCEL_ESCALATE_S": "60"}
    with worker_process([QUEUE], concurrency=1, name="kill-now", env=slow_escalation):
        deaf = start_run(
            "test-sleepy", {"seconds": 60, "cooperative": False}, trigger=TriggerKind.MANUAL
        )
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, deaf.run_id)))
        assert request_cancel(deaf.run_id, actor="ops") == "cancelling"
        time.sleep(1.5)
        assert _state(deaf.run_id) == "cancelling"  # the handler does not listen

        # Again, with kill: no 60 s wait.
        assert request_cancel(deaf.run_id, actor="ops", kill=True) == "cancelling"

        wait_for(lambda: _state(deaf.run_id) == "cancelled", timeout=10)
        wait_for(lambda: not alive(pid), timeout=10)

    assert live.read(deaf.run_id)["state"] == "cancelled"


def test_an_operator_retry_is_a_new_urgent_run_linked_to_the_original() -> None:
    original = start_run("test-sleepy", {"seconds": 1}, trigger=TriggerKind.MANUAL)
    with pytest.raises(NotRetryable, match="only failed or cancelled"):
        rerun(original.run_id, actor="ops")
    request_cancel(original.run_id, actor="ops")

    again = rerun(original.run_id, actor="ops")

    row = TaskHistory.objects.get(id=again.run_id)
    assert row.priority == 1
    assert row.trigger == {"kind": "operator-retry", "actor": "ops", "retryOf": original.run_id}
    assert row.input == TaskHistory.objects.get(id=original.run_id).input
    assert _state(original.run_id) == "cancelled"


def _owner(run_id: str) -> str:
    owner = str(live.read(run_id).get("owner") or "")
    assert owner, f"run {run_id} has no owner"
    return owner


def _pid_of(owner: str) -> int:
    """The pid in an instance id (`cluster.instance`: host:pid:suffix)."""
    return int(owner.split(":")[1])


def _cancel_channels() -> set[str]:
    """The cancel channels someone listens on, in this deployment's namespace."""
    return set(valkey.client().pubsub_channels(keys.cancel_channel_prefix() + "*"))


def _listeners(channel: str) -> int:
    return int(dict(valkey.client().pubsub_numsub(channel))[channel])


@pytest.mark.worker
def test_a_cancel_reaches_the_handler_on_its_process_channel() -> None:
    with worker_process([QUEUE], concurrency=1, name="channel", env=CHANNEL_ONLY):
        handle = start_run("test-sleepy", {"seconds": 60}, trigger=TriggerKind.MANUAL)
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, handle.run_id)))
        # The claim named the process before its handler began.
        owner = _owner(handle.run_id)
        assert _pid_of(owner) == pid
        # Its watch listens on the process's channel; nobody on one of the run's own.
        assert _listeners(keys.cancel_channel(owner)) == 1
        assert _listeners(keys.cancel_channel_prefix() + handle.run_id) == 0
        asked = time.monotonic()

        assert request_cancel(handle.run_id, actor="ops") == "cancelling"

        wait_for(lambda: _state(handle.run_id) == "cancelled", timeout=10)
        # Neither the 30 s heartbeat nor the 60 s escalation: the message.
        assert time.monotonic() - asked < 3
        assert alive(pid)


@pytest.mark.worker
def test_a_worker_listens_on_one_channel_whatever_the_number_of_runs() -> None:
    """Sampled every few ms while one pool child runs runs one after another: the cancel
    channels listened on are the child's own and no other, never one per run (a SUBSCRIBE and
    an UNSUBSCRIBE per run would show each run's channel while it runs)."""
    before = _cancel_channels()
    seen: set[str] = set()
    done = threading.Event()

    def sample() -> None:
        client = redis.Redis.from_url(settings.CONFIG.valkey_url, decode_responses=True)
        try:
            while not done.is_set():
                seen.update(client.pubsub_channels(keys.cancel_channel_prefix() + "*"))
                time.sleep(0.01)
        finally:
            client.close()

    with worker_process([QUEUE], concurrency=1, name="one-channel", env=CHANNEL_ONLY):
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            runs = [
                start_run("test-sleepy", {"seconds": 0.4}, trigger=TriggerKind.MANUAL).run_id
                for _ in range(6)
            ]
            for run_id in runs:
                wait_for(lambda r=run_id: _state(r) == "completed", timeout=30)
        finally:
            done.set()
            sampler.join()
        owners = {_owner(run_id) for run_id in runs}

    assert len(owners) == 1, owners  # one pool child ran them all
    assert seen - before == {keys.cancel_channel(owner) for owner in owners}


@pytest.mark.worker
def test_a_cancel_for_a_run_the_process_no_longer_watches_does_nothing() -> None:
    with worker_process([QUEUE], concurrency=1, name="late-cancel", env=FAST):
        earlier = start_run("test-sleepy", {"seconds": 0}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _state(earlier.run_id) == "completed", timeout=20)
        now = start_run("test-sleepy", {"seconds": 3}, trigger=TriggerKind.MANUAL)
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, now.run_id)))
        owner = _owner(now.run_id)
        assert owner == _owner(earlier.run_id)

        # Late messages for the earlier run, and two that name no run, heard by the watch of
        # the process running the other.
        for message in (
            keys.cancel_message(earlier.run_id),
            keys.cancel_message(earlier.run_id, kill=True),
            keys.CANCEL,
            keys.CANCEL_KILL,
        ):
            assert valkey.client().publish(keys.cancel_channel(owner), message) == 1

        wait_for(lambda: _state(now.run_id) == "completed", timeout=20)
        assert alive(pid)  # no kill either
    assert live.read(now.run_id)["state"] == "completed"


@pytest.mark.worker
def test_a_cancel_no_watch_heard_is_seen_by_the_heartbeat() -> None:
    """A cancel whose message nobody heard (sent before the run's watch began, or while the
    watch's connection was down) still stops the handler: the heartbeat reads `cancelling`."""
    with worker_process([QUEUE], concurrency=1, name="unheard", env=FAST):
        handle = start_run("test-sleepy", {"seconds": 60}, trigger=TriggerKind.MANUAL)
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, handle.run_id)))
        assert _pid_of(_owner(handle.run_id)) == pid
        wait_for(lambda: _state(handle.run_id) == "active", timeout=10)  # its claim written

        # The cancel as `runs.cancel` records it, its message sent where no watch listens.
        durable.request_cancel(handle.run_id)
        valkey.script(
            "request_cancel",
            [keys.run_active(handle.run_id), keys.run_terminal(handle.run_id), "nobody:"],
            ["ops", settings.CONFIG.run_active_ttl_s],
        )

        wait_for(lambda: _state(handle.run_id) == "cancelled", timeout=10)
        assert alive(pid)  # stopped cooperatively, not killed


@pytest.mark.worker
def test_the_watch_listens_again_after_its_connection_is_cut() -> None:
    """redis-py subscribes again when it reconnects: a watch whose connection Valkey dropped
    (a restart, a killed client) hears the next cancel without a run's help."""
    db = redis.connection.parse_url(settings.CONFIG.valkey_url).get("db", 0)
    with worker_process([QUEUE], concurrency=1, name="cut", env=CHANNEL_ONLY):
        warm = start_run("test-sleepy", {"seconds": 0}, trigger=TriggerKind.MANUAL)
        wait_for(lambda: _state(warm.run_id) == "completed", timeout=20)
        channel = keys.cancel_channel(_owner(warm.run_id))
        wait_for(lambda: _listeners(channel) == 1)
        # The pub/sub connections on this test's DB: the worker's watch (no other subscriber
        # uses this DB while the test runs).
        cut = [
            client["id"]
            for client in valkey.client().client_list(_type="pubsub")
            if int(client["db"]) == db
        ]
        assert cut
        for client_id in cut:
            valkey.client().client_kill_filter(_id=client_id)
        wait_for(lambda: _listeners(channel) == 1, timeout=10)

        handle = start_run("test-sleepy", {"seconds": 60}, trigger=TriggerKind.MANUAL)
        pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, handle.run_id)))
        asked = time.monotonic()
        assert request_cancel(handle.run_id, actor="ops") == "cancelling"

        wait_for(lambda: _state(handle.run_id) == "cancelled", timeout=10)
        assert time.monotonic() - asked < 3
        assert alive(pid)


@pytest.fixture
def pipe_queue() -> Iterator[str]:
    queue = queue_name(registry.get()["test-pipe"], settings.CONFIG.per_task_queues)
    yield queue
    empty_queues(queue)


def test_a_pipeline_cancel_tells_its_owner_and_each_running_stages_claimer(
    pipe_queue: str,
) -> None:
    """A stage runs under its run's watch but in whichever process took its message: the cancel
    goes to the run's owner (the hash's) and to each running stage's claimer (its step
    record's), and a kill now to both as well."""
    run_id = start_run("test-pipe", {}, trigger=TriggerKind.MANUAL).run_id
    owner, elsewhere = "host-a:101:OWNER", "host-b:202:STAGE"
    live.claim(run_id, owner, live.NO_PAUSE)
    assert durable.claim(run_id, owner) is not None
    assert durable.claim_stage(run_id, "probe", "io", elsewhere) is not None
    channels = {keys.cancel_channel(owner): owner, keys.cancel_channel(elsewhere): elsewhere}
    pubsub = valkey.client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(*channels)
    try:
        assert request_cancel(run_id, actor="ops", kill=True) == RunState.CANCELLING

        heard: dict[str, list[str]] = {}
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.1)
            if message is not None:
                heard.setdefault(channels[message["channel"]], []).append(message["data"])
    finally:
        pubsub.close()

    said = [keys.cancel_message(run_id), keys.cancel_message(run_id, kill=True)]
    assert heard == {owner: said, elsewhere: said}
    assert said == [f"cancel {run_id}", f"kill {run_id}"]
