"""Writing, reading and trimming what waits in the broker (kombu's Redis transport).

Depth is the sum of a queue's priority lists; messages already reserved by a worker
(prefetched, unacknowledged) are not waiting and are not counted or shed.

`Transport` is kombu's Redis transport, holding one client per channel instead of one per
command, and sending each acknowledgement with the next reservation.

kombu's Redis channel builds a new `redis.Redis` for every command it sends outside the
consumer's BRPOP (`Channel.conn_or_acquire`): the reservation of each delivered message in
the unacked hash, its acknowledgement, its restore. redis-py fills a case-insensitive table
of about 330 response callbacks in every client's constructor, so a worker's main process
spent about a quarter of its CPU per message building and dropping two clients
(docs/benchmarks.md, issue 9). A client is only a view of a connection pool, so one held
client per pool does the same work; it is built again whenever the channel replaces its pool
(after a fork or a lost connection), so it never outlives the connections it stands for.

kombu sends a message's acknowledgement (its removal from the unacked hash and index) in a
transaction of its own, after its run ended; a worker that drains a queue then reserves the
next message in another (issue 37). Here an acknowledgement waits for the next reservation
and goes in its transaction: one broker round trip per message fewer. It never waits longer
than the consumer's next BRPOP (one second when the queues are empty: `Channel._brpop_read`
sends what waits when nothing came) and it is sent before the channel restores or closes. What
it costs: a worker killed in that second leaves its last acknowledged messages in the unacked
hash, restored after the visibility timeout; their runs have ended, and their redelivery is
dropped as a duplicate (`runs.runner`), as a kill between a run's end and kombu's own ack
already did.

Selected by `CELERY_BROKER_TRANSPORT` for `redis://` and `rediss://` broker URLs; everything
else is kombu's own transport.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple

import redis
from django.conf import settings
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from orchestrator.stores import keys, valkey

log = logging.getLogger(__name__)

# Celery's default `task_publish_retry_policy` (3 retries, 0 s then +0.2 s a time): a broker
# that restarts is waited for as long as `send_task` would have waited.
_PUBLISH_RETRY_DELAYS_S = (0.0, 0.2, 0.4)


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.CONFIG.celery_broker_url, decode_responses=True)


def job_id(task_id: str, identity: str, run_id: str) -> str:
    """A run's message id (Celery's task id): names the work (task and identity) and the run
    that does it."""
    return f"{task_id}~~{identity}#{run_id}"


def push(
    queue: str,
    priority: int,
    headers: Mapping[str, Any],
    properties: Mapping[str, Any],
    body: str,
) -> None:
    """Put one JSON message on `queue` as kombu's Redis transport stores it (`Channel._put`
    after `Producer.publish` with the anonymous exchange): one LPUSH on a held connection.
    `properties` are the publisher's (Celery's correlation id and reply address); the
    transport's own (delivery mode and info, priority, body encoding, tag) are added here.

    kombu would build a new `redis.Redis` client for every publish (`conn_or_acquire`) and,
    through Celery's producer, wrap it in routing, declaration and retry layers that a message
    for a known queue does not need. The pool behind `client()` is thread-safe and fork-safe
    (redis-py checks the pid), and checks a pooled connection before handing it out, so a
    restarted broker costs a reconnect, not a failed publish.

    A retry after a lost reply may leave the message twice, as Celery's own publish retry may;
    the runner's claim lets only one of them run.
    """
    push_many([Message(queue, priority, headers, properties, body)])


class Message(NamedTuple):
    """What `push` takes, for `push_many`."""

    queue: str
    priority: int
    headers: Mapping[str, Any]
    properties: Mapping[str, Any]
    body: str


def push_many(messages: Sequence[Message]) -> None:
    """`push` for many messages in one round trip: a pipeline of LPUSHes, retried whole (a
    message left twice is harmless, as above)."""
    if not messages:
        return
    envelopes = [_envelope(*message) for message in messages]
    for delay in (*_PUBLISH_RETRY_DELAYS_S, None):
        pipe = client().pipeline(transaction=False)
        for name, envelope in envelopes:
            pipe.lpush(name, envelope)
        try:
            valkey.execute(pipe)
            return
        except (redis.ConnectionError, redis.TimeoutError):
            if delay is None:
                raise
            time.sleep(delay)


def _envelope(
    queue: str,
    priority: int,
    headers: Mapping[str, Any],
    properties: Mapping[str, Any],
    body: str,
) -> tuple[str, str]:
    """The list a message goes to and the JSON kombu's Redis transport stores there."""
    if priority not in keys.BROKER_PRIORITY_STEPS:
        # kombu would round it into another step: refuse rather than misfile it.
        raise ValueError(f"priority {priority} is not one of {keys.BROKER_PRIORITY_STEPS}")
    envelope = json.dumps(
        {
            "body": base64.b64encode(body.encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                **properties,
                "delivery_mode": 2,  # persistent
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": priority,
                "body_encoding": "base64",
                # kombu's key in the unacked hash while a worker holds the message.
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )
    return keys.broker_queue(queue, priority), envelope


def depth(queues: Sequence[str]) -> int:
    """Messages waiting in `queues`, one round trip."""
    pipe = client().pipeline(transaction=False)
    for queue in queues:
        for step in keys.BROKER_PRIORITY_STEPS:
            pipe.llen(keys.broker_queue(queue, step))
    return sum(valkey.execute(pipe))


def shed_oldest(queues: Sequence[str], count: int, least_urgent_kept: int) -> list[str]:
    """Remove up to `count` waiting messages from `queues`, least urgent and oldest first,
    never one more urgent than `least_urgent_kept`; returns the removed messages' run ids."""
    steps = [s for s in reversed(keys.BROKER_PRIORITY_STEPS) if s >= least_urgent_kept]
    lists = [keys.broker_queue(queue, step) for step in steps for queue in queues]
    removed = valkey.script(
        "shed_oldest", lists, [count, *([len(queues)] * len(steps))], client=client()
    )
    return [str(run_id) for run_id in removed]


def remove_waiting(queue: str, run_id: str) -> bool:
    """Take one run's message out of `queue` if it still waits there."""
    lists = [keys.broker_queue(queue, step) for step in keys.BROKER_PRIORITY_STEPS]
    return bool(valkey.script("remove_message", lists, [run_id, len(lists)], client=client()))


class QoS(kombu_redis.QoS):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acked: list[str] = []  # acknowledged, still in the unacked hash and index

    def append(self, message: Any, delivery_tag: str) -> None:
        """kombu's reservation (index and hash, one transaction), with the removals of the
        acknowledgements that wait."""
        delivery = message.delivery_info
        raw = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.pipe_or_acquire() as pipe:
            self._remove_acked(pipe)
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
            pipe.hset(self.unacked_key, delivery_tag, raw)
            pipe.execute()
        self._acked.clear()
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        self._acked.append(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def send_acks(self) -> None:
        """The acknowledgements that wait, in one transaction now."""
        if not self._acked:
            return
        with self.pipe_or_acquire() as pipe:
            self._remove_acked(pipe)
            pipe.execute()
        self._acked.clear()

    def _remove_acked(self, pipe: Any) -> None:
        for tag in self._acked:
            pipe.zrem(self.unacked_index_key, tag)
            pipe.hdel(self.unacked_key, tag)

    def restore_unacked(self, client: Any = None) -> None:
        self.send_acks()
        super().restore_unacked(client)


class Channel(kombu_redis.Channel):
    QoS = QoS
    _held_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            # (kombu's stubs in celery-types leave the private method out)
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool
        held = self._held_client
        if held is None or held.connection_pool is not pool:
            held = self._held_client = self.Client(connection_pool=pool)
        return held

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[misc]
        except virtual.Empty:
            # Nothing came within the BRPOP's timeout: no reservation will carry them.
            self._send_acks()
            raise

    def close(self) -> None:
        if not self.closed:
            try:
                self._send_acks()
            except (redis.ConnectionError, redis.TimeoutError):
                # The broker is gone: those messages come back after the visibility timeout,
                # and their ended runs drop them.
                log.warning("broker unreachable at close: acknowledgements not sent")
        super().close()

    def _send_acks(self) -> None:
        if isinstance(self._qos, QoS):
            self._qos.send_acks()


class Transport(kombu_redis.Transport):
    Channel = Channel
