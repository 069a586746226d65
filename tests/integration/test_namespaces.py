"""Two deployments on one Valkey server, each on DBs of its own, see only their own events.

Keys stay in the DB a deployment's URLs select, but pub/sub channels are the server's: before
LUMASTRA_NAMESPACE, `/api/v1/events` of one stack streamed the other's live events. Here two
stacks (a web and a worker role each, as real processes) share a server this module starts,
with nothing else on it, so every channel on it is one of theirs; neither sets
LUMASTRA_NAMESPACE, so each gets the default from its VALKEY_URL's DB. They share the test
database only (real deployments do not): state changes, which `/events` reads from Postgres,
reach both streams here, and only the live events, from Valkey, tell the stacks apart.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import requests
from celery import current_app
from django.conf import LazySettings, settings

from orchestrator.api import tokens
from orchestrator.routing import queue_name
from orchestrator.runs import cancel, context
from orchestrator.runs.start import start_run
from orchestrator.stores import broker, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.faults.servers import ValkeyServer
from tests.support.fixtures import wait_for, worker_process
from tests.support.servers import web_process
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TASK = "slow-progress"


@dataclass(frozen=True)
class Stack:
    namespace: str  # what the stack's VALKEY_URL DB should give it
    web: str  # the web role's base URL
    broker_db: int
    coordination_db: int


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyServer]:
    own = ValkeyServer(aof=False, log_path=tmp_path_factory.mktemp("valkey") / "valkey.log")
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def stacks(server: ValkeyServer, django_db_setup: None) -> Iterator[tuple[Stack, Stack]]:
    """Stack A on DBs 1 (coordination), 3 (broker), 5 (cache); stack B on 2, 4, 6."""
    queue = queue_name(registry.get()[TASK], settings.CONFIG.per_task_queues)
    with ExitStack() as running:
        found = []
        for name, coordination, broker, cache in (("a", 1, 3, 5), ("b", 2, 4, 6)):
            env = {
                "VALKEY_URL": server.url(coordination),
                "CELERY_BROKER_URL": server.url(broker),
                "VALKEY_CACHE_URL": server.url(cache),
            }
            running.enter_context(worker_process([queue], 1, f"ns-{name}", env))
            url = running.enter_context(
                web_process(f"web-ns-{name}", LUMASTRA_SSE_KEEPALIVE_S="1", **env)
            )
            found.append(Stack(f"db{coordination}", url, broker, coordination))
        yield found[0], found[1]


@pytest.fixture
def client(server: ValkeyServer) -> Iterator[redis.Redis]:
    own = redis.Redis.from_url(server.url(0), decode_responses=True)
    yield own
    own.close()


def _session() -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {tokens.issue(operator(), 'ns')[1]}"
    return session


def _start(session: requests.Session, stack: Stack, steps: int, **extra: Any) -> str:
    answer = session.post(
        f"{stack.web}/api/v1/runs",
        json={"task": TASK, "input": {"steps": steps, "step_seconds": 0.3}, **extra},
        timeout=30,
    )
    assert answer.status_code in (200, 202), answer.text
    run_id: str = answer.json()["run_id"]
    return run_id


def _subscribers(client: redis.Redis, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel))[channel])


def _events(stream: requests.Response, ended: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of an open SSE stream until every run in `ended` completed and a
    keep-alive followed (a second with nothing sent: a stray live event would be in by then)."""
    found: list[tuple[str, dict[str, Any]]] = []
    completed: set[str] = set()
    event: dict[str, str] = {}
    for raw in stream.iter_lines(decode_unicode=True):
        if raw.startswith(":") and completed >= ended:
            return found
        if raw == "" and "data" in event:
            data = json.loads(event["data"])
            found.append((event.get("event", ""), data))
            if event.get("event") == "run" and data.get("state") == "completed":
                completed.add(data["run_id"])
            event = {}
        elif raw and not raw.startswith(":"):
            name, _, value = raw.partition(": ")
            event[name] = value
    raise AssertionError(f"stream ended before {ended - completed} completed")


def test_two_stacks_on_one_server_see_only_their_own_live_events(
    stacks: tuple[Stack, Stack], client: redis.Redis
) -> None:
    a, b = stacks
    session = _session()
    with (
        session.get(f"{a.web}/api/v1/events", stream=True, timeout=60) as stream_a,
        session.get(f"{b.web}/api/v1/events", stream=True, timeout=60) as stream_b,
    ):
        # Each web role follows its own namespace's channel (the default, from its DB).
        wait_for(lambda: _subscribers(client, "db1:task:events") == 1)
        wait_for(lambda: _subscribers(client, "db2:task:events") == 1)
        assert _subscribers(client, "task:events") == 0

        run_a, run_b = _start(session, a, 3), _start(session, b, 3)
        seen_a = _events(stream_a, {run_a, run_b})
        seen_b = _events(stream_b, {run_a, run_b})

    def live_runs(seen: list[tuple[str, dict[str, Any]]]) -> set[str]:
        return {data["run_id"] for event, data in seen if event in ("progress", "stage")}

    assert live_runs(seen_a) == {run_a}
    assert live_runs(seen_b) == {run_b}


def _owner(server: ValkeyServer, stack: Stack, run_id: str) -> str:
    """The instance id of the process running the run (its live hash's owner)."""
    own = redis.Redis.from_url(server.url(stack.coordination_db), decode_responses=True)
    try:
        return str(own.hget(keys.run_active(run_id), "owner") or "")
    finally:
        own.close()


def test_waits_log_followers_and_cancel_listeners_use_their_own_namespace(
    server: ValkeyServer, stacks: tuple[Stack, Stack], client: redis.Redis
) -> None:
    session = _session()
    answers: dict[str, requests.Response] = {}
    runs: dict[str, str] = {}

    def wait_for_end(stack: Stack, key: str) -> None:
        answers[stack.namespace] = session.post(
            f"{stack.web}/api/v1/runs?wait=30",
            json={
                "task": TASK,
                "input": {"steps": 100, "step_seconds": 0.3},
                "idempotency_key": key,
            },
            timeout=60,
        )

    with ExitStack() as followers:
        for stack in stacks:
            # The waiter's POST answers only at the run's end: the same key again names the run.
            key = f"ns-{stack.namespace}-{id(answers)}"
            waiter = threading.Thread(target=wait_for_end, args=(stack, key))
            waiter.start()
            followers.callback(waiter.join, 60)
            runs[stack.namespace] = _start(session, stack, 100, idempotency_key=key)
            followers.enter_context(
                session.get(
                    f"{stack.web}/api/v1/runs/{runs[stack.namespace]}/logs",
                    stream=True,
                    timeout=60,
                )
            )

        for stack in stacks:
            namespace, run_id = stack.namespace, runs[stack.namespace]
            other = "db2" if namespace == "db1" else "db1"
            # The handler's watch listens on its process's channel, named by the run's owner.
            owner = wait_for(lambda s=stack, r=run_id: _owner(server, s, r))
            # The waiter, the log follower, the handler.
            for channel in (f"ended:{run_id}", f"logfeed:{run_id}", f"cancel:{owner}"):
                wait_for(lambda c=f"{namespace}:task:{channel}": _subscribers(client, c))
                assert _subscribers(client, f"{other}:task:{channel}") == 0
                assert _subscribers(client, f"task:{channel}") == 0
        # Nothing on the server listens on a channel without a namespace.
        channels = client.pubsub_channels()
        assert channels and all(c.startswith(("db1:", "db2:")) for c in channels), channels

        for stack in stacks:
            cancelled = session.post(
                f"{stack.web}/api/v1/runs/{runs[stack.namespace]}/cancel", timeout=30
            )
            assert cancelled.status_code == 200, cancelled.text
    # The cancel reached each handler and each end its waiter, in its own namespace.
    assert {ns: (a.status_code, a.json()["state"]) for ns, a in answers.items()} == {
        "db1": (200, "cancelled"),
        "db2": (200, "cancelled"),
    }


def test_celery_broadcasts_carry_the_broker_db(server: ValkeyServer) -> None:
    """Celery's own pub/sub (worker control, events) is kombu's fanout, which subscribes by
    pattern (absent from PUBSUB CHANNELS above): kombu's Redis transport prefixes it with the
    broker's DB, and our transport and its options keep that."""
    for db in (3, 4):
        with current_app.connection_for_write(server.url(db)) as connection:
            assert connection.default_channel.keyprefix_fanout == f"/{db}."


def test_what_one_namespace_publishes_never_reaches_the_other(settings: LazySettings) -> None:
    """The publishers themselves (events, the end of a run, its log feed, its cancel signal and
    kill now) on the tests' own server, under two namespaces in turn."""
    theirs = dataclasses.replace(settings.CONFIG, namespace="theirs")
    ours = settings.CONFIG
    settings.CONFIG = theirs
    handle = start_run("test-unique", {"key": f"ns-{id(theirs)}"}, trigger=TriggerKind.API)
    # A run a worker process claimed (in Valkey: the cancel writes its Postgres claim): its
    # cancel goes to that process's channel.
    running = start_run("test-unique", {"key": f"ns-run-{id(theirs)}"}, trigger=TriggerKind.API)
    owner = "ns-host:1:OWNER"
    live.claim(running.run_id, owner, live.NO_PAUSE)

    def channels() -> list[str]:
        return [
            keys.run_events(),
            keys.run_ended(handle.run_id),
            keys.run_log_feed(handle.run_id),
            keys.cancel_channel(owner),
        ]

    settings.CONFIG = ours
    our_channels = channels()
    settings.CONFIG = theirs
    their_channels = channels()
    pubsub = valkey.client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(*our_channels, *their_channels)
    try:
        pipe = valkey.client().pipeline(transaction=False)
        live.queue_event(pipe, {"type": "progress", "run_id": handle.run_id})
        valkey.execute(pipe)
        run_log = context.RunLog(handle.run_id)
        run_log.write("info", "a line")
        run_log.flush()
        cancel.request_cancel(handle.run_id, actor="test")  # a pending run: cancel, then end
        cancel.request_cancel(running.run_id, actor="test", kill=True)  # a running one

        # A second for stragglers; None is also what a subscription's confirmation reads as.
        heard: dict[str, list[str]] = {}
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.1)
            if message is not None:
                heard.setdefault(message["channel"], []).append(message["data"])
    finally:
        pubsub.close()
        settings.CONFIG = ours
        queue = queue_name(registry.get()["test-unique"], settings.CONFIG.per_task_queues)
        broker.remove_waiting(queue, running.run_id)

    assert set(heard) == set(their_channels)
    assert heard[their_channels[2]] == ["1"]  # the log's last line number
    assert heard[their_channels[3]] == [f"cancel {running.run_id}", f"kill {running.run_id}"]
    assert heard[their_channels[1]] == ["cancelled"]
    assert all(channel.startswith("theirs:") for channel in their_channels)
    assert all(channel.startswith(f"{ours.namespace}:") for channel in our_channels)
