"""This process's identity in the cluster: unique per process start, never just the host."""

from __future__ import annotations

import os
import socket

from ulid import ULID

_by_pid: dict[int, str] = {}


def instance_id() -> str:
    # Keyed by pid: a forked pool child is a new instance, not its parent.
    pid = os.getpid()
    if pid not in _by_pid:
        _by_pid[pid] = f"{socket.gethostname()}:{pid}:{str(ULID())[-8:]}"
    return _by_pid[pid]


def is_dead_here(instance: str) -> bool:
    """True when `instance` ran on this host and its process is gone. Other hosts' instances
    cannot be judged from here (their heartbeats are the reconciler's business)."""
    host, _, rest = instance.partition(":")
    pid_text = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
