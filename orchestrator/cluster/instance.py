"""This process's identity in the cluster: unique per process start, never just the host."""

from __future__ import annotations

import os
import socket
from functools import cache

from ulid import ULID


@cache
def instance_id() -> str:
    """Made once per process (every run's claim names it: a cached call runs no code here)."""
    return f"{socket.gethostname()}:{os.getpid()}:{str(ULID())[-8:]}"


# A forked pool child is a new instance, not its parent.
os.register_at_fork(after_in_child=instance_id.cache_clear)


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
