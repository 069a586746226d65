"""Writing, reading and trimming what waits in the broker (kombu's Redis transport).

Depth is the sum of a queue's priority lists; messages already reserved by a worker
(prefetched, unacknowledged) are not waiting and are not counted or shed.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple

import redis
from django.conf import settings

from orchestrator.stores import keys, scripts, valkey

# Celery's default `task_publish_retry_policy` (3 retries, 0 s then +0.2 s a time): a broker
# that restarts is waited for as long as `send_task` would have waited.
_PUBLISH_RETRY_DELAYS_S = (0.0, 0.2, 0.4)


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.CONFIG.celery_broker_url, decode_responses=True)


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
    removed = scripts.call(
        "shed_oldest", lists, [count, *([len(queues)] * len(steps))], client=client()
    )
    return [str(run_id) for run_id in removed]


def remove_waiting(queue: str, run_id: str) -> bool:
    """Take one run's message out of `queue` if it still waits there."""
    lists = [keys.broker_queue(queue, step) for step in keys.BROKER_PRIORITY_STEPS]
    return bool(scripts.call("remove_message", lists, [run_id, len(lists)], client=client()))
