"""The node roster: every worker-role process announces itself in `cluster:node:<instanceId>`
every NODE_BEAT_S with a TTL of NODE_TTL_S, so the roster lists exactly the processes alive in
the last NODE_TTL_S. The instance id is unique per process start (host, pid and a random
suffix), so a restarted process is a new node and a dead one simply expires.

A node says what it is: host, pid, role (`worker`: one Celery worker, `loops`: the
orchestrator loops), the queues it consumes, the pools (a worker's own pool; for the loops
process, every pool its host runs), the project version (`pyproject.toml`, read once) and its
start time. Fields added later have defaults and unknown ones are ignored, so nodes of two
versions read each other's announcements during a rolling deploy.

Not guaranteed: a process frozen (SIGSTOP) for longer than the TTL drops out and reappears
when it resumes; the roster is for operators, liveness of runs is judged by their heartbeats.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

from orchestrator.cluster.instance import instance_id
from orchestrator.routing import plan_pools
from orchestrator.stores import keys, valkey
from tasks import registry
from tasks.resources import budgets

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
    pools: tuple[str, ...] = ()
    version: str = ""
    # A file watcher's media roots, the ones whose seats it holds (`coverage.watcher`).
    watching: tuple[str, ...] = ()

    @property
    def started(self) -> datetime | None:
        try:
            return datetime.fromisoformat(self.started_at)
        except ValueError:
            return None


_FIELDS = {f.name for f in fields(Node)}
_TUPLES = ("queues", "pools", "watching")


@cache
def project_version() -> str:
    """The version in `pyproject.toml` (the one place it is written), read once per process."""
    path = Path(settings.BASE_DIR) / "pyproject.toml"
    try:
        with path.open("rb") as handle:
            return str(tomllib.load(handle)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        log.warning("no project version in %s", path)
        return "unknown"


def host_pools() -> list[str]:
    """The pools this host's worker role runs (the same plan `lumastra.workers` starts)."""
    config = settings.CONFIG
    plan = plan_pools(
        registry.get().values(),
        budgets(config.concurrency_overrides, config.queue_depth_cap_overrides),
        config.per_task_queues,
    )
    return [pool.name for pool in plan]


def this_node(role: str, queues: Sequence[str], *, pools: Sequence[str] = ()) -> Node:
    return Node(
        instance_id=instance_id(),
        host=socket.gethostname(),
        pid=os.getpid(),
        role=role,
        queues=tuple(queues),
        started_at=datetime.now(UTC).isoformat(),
        pools=tuple(pools),
        version=project_version(),
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
            known = {k: v for k, v in data.items() if k in _FIELDS}
            for name in _TUPLES:
                known[name] = tuple(known.get(name) or ())
            nodes.append(Node(**known))
    return nodes


def last_beats(nodes: Sequence[Node]) -> dict[str, timedelta]:
    """How long ago each node last announced itself, from its key's remaining TTL (each
    announcement sets it to NODE_TTL_S): one round trip."""
    pipe = valkey.client().pipeline(transaction=False)
    for node in nodes:
        pipe.pttl(keys.cluster_node(node.instance_id))
    remaining: list[int] = valkey.execute(pipe) if nodes else []
    return {
        node.instance_id: timedelta(milliseconds=max(0, NODE_TTL_S * 1000 - left))
        for node, left in zip(nodes, remaining, strict=True)
        if left >= 0
    }


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
    pool = str(getattr(sender, "hostname", "") or "").partition("@")[0]
    keep_announcing(this_node("worker", queues, pools=[pool] if pool else []))
