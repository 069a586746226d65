"""The node roster: every worker-role process announces itself in `cluster:node:<instanceId>`
every NODE_BEAT_S with a TTL of NODE_TTL_S, so the roster lists exactly the processes alive in
the last NODE_TTL_S. The instance id is unique per process start (host, pid and a random
suffix), so a restarted process is a new node and a dead one simply expires.

Not guaranteed: a process frozen (SIGSTOP) for longer than the TTL drops out and reappears
when it resumes; the roster is for operators, liveness of runs is judged by their heartbeats.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from orchestrator import keys, valkey
from orchestrator.instance import instance_id

log = logging.getLogger(__name__)

NODE_BEAT_S = 10
NODE_TTL_S = 30


@dataclass(frozen=True)
class Node:
    instance_id: str
    host: str
    pid: int
    role: str
    queues: tuple[str, ...]
    started_at: str


def this_node(role: str, queues: Sequence[str]) -> Node:
    return Node(
        instance_id=instance_id(),
        host=socket.gethostname(),
        pid=os.getpid(),
        role=role,
        queues=tuple(queues),
        started_at=datetime.now(UTC).isoformat(),
    )


def announce(node: Node) -> None:
    valkey.client().set(
        keys.cluster_node(node.instance_id), json.dumps(asdict(node)), ex=NODE_TTL_S
    )


def roster() -> list[Node]:
    client = valkey.client()
    names = sorted(client.scan_iter(match=keys.cluster_node("*"), count=500))
    values: list[str | None] = client.mget(names) if names else []  # type: ignore[assignment]
    nodes = []
    for raw in values:
        if raw is not None:  # expired between the scan and the read
            data: dict[str, Any] = json.loads(raw)
            nodes.append(Node(**{**data, "queues": tuple(data["queues"])}))
    return nodes


def keep_announcing(node: Node, stop: threading.Event | None = None) -> threading.Thread:
    """Announce now and every NODE_BEAT_S in a daemon thread, until `stop` is set."""
    stopped = stop or threading.Event()

    def beat() -> None:
        while True:
            try:
                announce(node)
            except Exception:
                log.exception("node %s: announce failed", node.instance_id)
            if stopped.wait(NODE_BEAT_S):
                return

    thread = threading.Thread(target=beat, name="node-roster", daemon=True)
    thread.start()
    return thread


def on_worker_ready(sender: Any, **_: Any) -> None:
    """Celery's worker_ready, in the worker's main process: announce it with its queues."""
    queues = sorted(sender.app.amqp.queues.consume_from or {})
    keep_announcing(this_node("worker", queues))
