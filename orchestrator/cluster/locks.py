"""Loop locks: at most one process in the cluster runs a loop's writes (`lock:orch:<name>`).

A lock is a Valkey string holding its holder's token (the instance id plus a random suffix,
unique per `LoopLock` object), with a lease (PX). `hold()` acquires it with SET NX PX, or
renews it when it is already ours. `check()` is the fencing check a loop makes before each
write batch: one Lua script (`lua/lock_renew.lua`) compares the token and renews the lease
atomically, so a holder whose lease ran out, and was taken by another process, learns it
before writing and can never renew the other's lease. `release()` deletes the lock only if
it is still ours (`lua/lock_release.lua`), so a stopping process hands over at once.

`LoopLock` is the one lock mechanism: the leader of `orchestrator.cluster.leaders` holds the
cluster's (`lock:orch:cluster`), and a loop run outside a loops process (an operator's
`--once`, a test) takes that same lock itself. Both implement `FencedLock`, the interface
the reconciler and the drain write under.

Not guaranteed: the check narrows the window, it does not close it. A holder paused between
its check and its write (a long GC pause, SIGSTOP) can still write after losing the lock. The
loops that use these locks therefore make every write a compare-and-set in Postgres, so such
a late write is at worst redundant, never contradictory.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from orchestrator.clock import span_ms
from orchestrator.cluster.instance import instance_id
from orchestrator.stores import keys, valkey


class LockLost(Exception):
    """The loop no longer holds its lock: it must stop writing at once."""


class Fence(Protocol):
    """The one fence protocol: checked before each write; raises LockLost when the caller
    may no longer write."""

    def check(self) -> None: ...


class FencedLock(Fence, Protocol):
    """What a once-per-cluster loop writes under: a `LoopLock`, or a leader's seat
    (`orchestrator.cluster.leaders.Leadership`), which never acquires, only confirms."""

    @property
    def key(self) -> str: ...

    def hold(self) -> bool:
        """True when the caller may write now (the lock is, or has just become, its own)."""
        ...

    def check(self) -> None:
        """Raises LockLost unless the lock is the caller's (atomic compare in Valkey)."""
        ...

    def release(self) -> bool: ...

    def holder(self) -> str | None: ...


def _new_token() -> str:
    return f"{instance_id()}:{secrets.token_hex(4)}"


@dataclass
class LoopLock:
    name: str
    lease: timedelta
    token: str = field(default_factory=_new_token)

    @property
    def key(self) -> str:
        return keys.orchestrator_lock(self.name)

    def _lease_ms(self) -> int:
        return max(1, span_ms(self.lease))

    def hold(self) -> bool:
        """Acquire the lock, or renew it if it is ours; False while another process holds it."""
        if self.renew():
            return True
        return bool(valkey.client().set(self.key, self.token, nx=True, px=self._lease_ms()))

    def try_acquire(self) -> tuple[bool, int]:
        """One attempt to take the lock (SET NX PX), without renewing it if it is ours; returns
        (taken, ms until the current lease ends), read in the same MULTI as the attempt, so a
        candidate knows when to try again. The ms are -2 when the lock vanished meanwhile."""
        pipe = valkey.client().pipeline(transaction=True)
        pipe.set(self.key, self.token, nx=True, px=self._lease_ms())
        pipe.pttl(self.key)
        taken, ttl_ms = valkey.execute(pipe)
        return bool(taken), int(ttl_ms)

    def renew(self) -> bool:
        """Compare and renew in one step; False when the lock is gone or someone else's."""
        return bool(valkey.script("lock_renew", [self.key], [self.token, self._lease_ms()]))

    def check(self) -> None:
        """The fencing check before a write batch: raises LockLost unless the lock is ours."""
        if not self.renew():
            raise LockLost(f"{self.key} is no longer held by {self.token}")

    def release(self) -> bool:
        """Give the lock up if it is still ours; True when it was."""
        return bool(valkey.script("lock_release", [self.key], [self.token]))

    def holder(self) -> str | None:
        """The token of whoever holds the lock now, if anyone (for logs and the admin)."""
        value = valkey.client().get(self.key)
        return None if value is None else str(value)
