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
