"""Reading and trimming what waits in the broker (kombu's Redis transport).

Depth is the sum of a queue's priority lists; messages already reserved by a worker
(prefetched, unacknowledged) are not waiting and are not counted or shed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import redis
from django.conf import settings

from orchestrator.stores import keys, scripts, valkey


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.CONFIG.celery_broker_url, decode_responses=True)


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
