"""A run's message as a worker would receive it: taken out of its queue in the broker."""

from __future__ import annotations

import base64
import json
from typing import Any

from django.conf import settings

from orchestrator.routing import queue_name
from orchestrator.stores import broker, keys
from tasks import registry


def take_message(task_id: str, run_id: str) -> tuple[list[Any], dict[str, Any]]:
    """The args and kwargs of `run_id`'s message waiting in its task's queue, removed from it
    (as a worker's delivery takes it); AssertionError when there is none."""
    queue = queue_name(registry.get()[task_id], settings.CONFIG.per_task_queues)
    client = broker.client()
    for step in keys.BROKER_PRIORITY_STEPS:
        name = keys.broker_queue(queue, step)
        for envelope in client.lrange(name, 0, -1):
            args, kwargs, _ = json.loads(base64.b64decode(json.loads(envelope)["body"]))
            if args[0] == run_id:
                client.lrem(name, 1, envelope)
                return args, kwargs
    raise AssertionError(f"no message for run {run_id} in {queue}")


def empty_queues(*queues: str) -> None:
    """Drop the messages waiting in `queues` (every priority step of each): what earlier
    tests published and no worker took, so a test's worker meets only the test's own."""
    names = [
        keys.broker_queue(queue, step) for queue in queues for step in keys.BROKER_PRIORITY_STEPS
    ]
    broker.client().delete(*names)
