"""The leader: the one process of the cluster that runs the once-per-cluster loops.

Every loops process (`python -m orchestrator.loops`, one per worker host) runs one `Elector`
in its own thread. The elector races for one seat, `lock:orch:cluster` (`CLUSTER`), a
`LoopLock` (`orchestrator.cluster.locks`): its holder runs the loops that must run once per
cluster (the reconciler, the drain replay, the quota rollup, webhook delivery, the coverage
stage-sweep and outbox dispatcher). There is no other seat. No loop needs a leader per
resource class, and an elected seat that drives nothing would show a leader that does
nothing (no `lock:orch:<class>`: docs/architecture.md, "Decisions and departures").

The seat is taken with SET NX PX LUMASTRA_LEADER_TTL_S (15 s) and renewed every
LUMASTRA_LEADER_RENEW_S (5 s) by a Lua compare-and-renew (`lua/lock_renew.lua`). A candidate
that finds the seat taken reads the lease's remaining time in the same MULTI and tries again
when it ends, plus a random delay of up to LUMASTRA_LEADER_JITTER_S, so a dead leader is
replaced within TTL + jitter of its last renewal. A leader whose renewal fails (the lock is
someone else's, gone, or Valkey did not answer) stops leading at once: `leads()` turns
False, the next `check()` of a running tick raises `LockLost`, and the process re-enters the
race after a jittered backoff (doubling from the renew interval up to the TTL while it keeps
losing). On shutdown the elector releases the seat, so a successor takes over at once.

Fencing. A loop writes only through the seat's `Leadership` (a `FencedLock`): `hold()` at the
start of a tick and `check()` before each write batch compare the lock's value with this
process's token and renew it, atomically in Lua. A leader paused past its TTL (SIGSTOP, a long
GC pause) therefore finds, when it wakes, that it no longer leads before its next write batch:
its local view is also void once a TTL has passed since its last successful renewal, even
before Valkey is asked.

Not guaranteed:
- The compare and the write are two steps: a process paused between a successful check and
  the write it guards still makes that one write late. Every write of the once-per-cluster
  loops is a compare-and-set in Postgres (and fenced by the run's owner in Valkey), so such a
  late write is at worst redundant, never contradictory.
- At most one leader as long as Valkey keeps the lock: a failover of the coordination Valkey
  that loses the key (no persistence, async replica) can briefly give the seat two holders.
- Failover time: up to TTL + jitter after the leader's last renewal (see docs/reliability.md
  for measurements), plus the time the loop needs to start its next tick.
- Non-leaders keep serving: nothing in `start_run` or the runner depends on leadership.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings

from orchestrator.backoff import exponential
from orchestrator.cluster.locks import LockLost, LoopLock
from orchestrator.stores import keys, valkey

log = logging.getLogger(__name__)

# The seat of the once-per-cluster loops: `lock:orch:cluster`.
CLUSTER = "cluster"


def instance_of(token: str) -> str:
    """The instance id in a lock token (`<instanceId>:<suffix>`, see `cluster.locks`)."""
    return token.rpartition(":")[0] or token


def leader() -> str | None:
    """The instance id leading the cluster right now, if any (one GET)."""
    value = valkey.client().get(keys.orchestrator_lock(CLUSTER))
    return None if value is None else instance_of(str(value))


@dataclass
class _Seat:
    lock: LoopLock
    leading: bool = False
    renewed_at: float = 0.0  # monotonic time of the last renewal Valkey confirmed
    next_attempt: float = 0.0  # monotonic time of the next attempt to take the seat
    losses: int = 0  # times lost in a row (reset once held for a whole TTL)
    led_since: float = 0.0


class Leadership:
    """The seat as a loop writes under it (`cluster.locks.FencedLock`). It never takes the
    seat (the elector does); it only confirms, atomically, that this process still holds it."""

    def __init__(self, elector: Elector) -> None:
        self._elector = elector

    @property
    def key(self) -> str:
        return self._elector.lock.key

    def hold(self) -> bool:
        """True when this process leads: its local view says so and Valkey agrees
        (compare-and-renew in Lua). A refusal ends the leadership at once."""
        return self._elector.confirm()

    def check(self) -> None:
        """The fencing check before a write batch; raises LockLost unless this process leads."""
        if not self.hold():
            raise LockLost(f"{self.key} is no longer led by this process")

    def release(self) -> bool:
        """Give the seat up (shutdown); True when it was ours."""
        return self._elector.resign()

    def holder(self) -> str | None:
        return self._elector.lock.holder()


@dataclass
class Elector:
    """Races for the cluster seat and keeps it while it wins; `run` drives it in a thread."""

    ttl: timedelta = field(default_factory=lambda: timedelta(seconds=settings.CONFIG.leader_ttl_s))
    renew_every: timedelta = field(
        default_factory=lambda: timedelta(seconds=settings.CONFIG.leader_renew_s)
    )
    jitter: timedelta = field(
        default_factory=lambda: timedelta(seconds=settings.CONFIG.leader_jitter_s)
    )
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.renew_every >= self.ttl:
            raise ValueError(
                f"the leader renew interval ({self.renew_every}) must be shorter than "
                f"the lease ({self.ttl})"
            )
        self._guard = threading.Lock()
        self._seat = _Seat(LoopLock(CLUSTER, self.ttl))

    # --- what loops ask -------------------------------------------------------------------

    def fence(self) -> Leadership:
        return Leadership(self)

    @property
    def lock(self) -> LoopLock:
        return self._seat.lock

    def leads(self) -> bool:
        """This process's local view, no round trip: leading, and renewed within one TTL."""
        with self._guard:
            state = self._seat
            return state.leading and self.clock() - state.renewed_at < self._ttl_s

    def confirm(self) -> bool:
        if not self.leads():
            return False
        try:
            renewed = self._seat.lock.renew()
        except Exception:
            log.exception("leader: could not confirm %s", self._seat.lock.key)
            renewed = False
        self._settle(renewed)
        return renewed

    def resign(self) -> bool:
        with self._guard:
            state = self._seat
            was_leading, state.leading = state.leading, False
            state.next_attempt = self.clock() + self._backoff_s(1)
        released = state.lock.release()
        if was_leading:
            log.info("leader: released %s", state.lock.key)
        return released

    def hand_over(self) -> None:
        """Give the seat up (shutdown), so a successor takes over without waiting for a TTL."""
        try:
            self.resign()
        except Exception:
            log.exception("leader: could not release %s; its lease will run out", self.lock.key)

    # --- the race ---------------------------------------------------------------------------

    def step(self) -> float:
        """Renew the seat if this process leads it, try for it if its turn has come; returns
        the seconds until something is due again."""
        now = self.clock()
        wake = now + self._renew_s
        state = self._seat
        if state.leading:
            if now - state.renewed_at >= self._renew_s:
                self._renew()
            wake = min(wake, state.renewed_at + self._renew_s)
        else:
            if now >= state.next_attempt:
                self._attempt()
            if not state.leading:
                wake = min(wake, state.next_attempt)
        return max(0.0, wake - self.clock())

    def run(self, stop: threading.Event) -> None:
        """Drive the race until `stop` is set, then release the seat."""
        try:
            while not stop.is_set():
                try:
                    delay = self.step()
                except Exception:
                    log.exception("leader: election step failed; trying again")
                    delay = self._renew_s
                stop.wait(min(delay, self._renew_s))
        finally:
            self.hand_over()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="leader", daemon=True)
        thread.start()
        return thread

    def _attempt(self) -> None:
        state = self._seat
        try:
            taken, ttl_ms = state.lock.try_acquire()
        except Exception:
            log.exception("leader: could not try for %s", state.lock.key)
            with self._guard:
                state.next_attempt = self.clock() + self._renew_s + self._jitter_s()
            return
        if not taken and state.losses:
            # A renewal that failed on an error may have left the lock ours: take it back.
            try:
                taken = state.lock.renew()
            except Exception:
                taken = False
        now = self.clock()
        with self._guard:
            if taken:
                state.leading = True
                state.renewed_at = state.led_since = now
                log.info("leader: now leading %s as %s", state.lock.key, state.lock.token)
                return
            # Try again when the holder's lease ends (re-read every renew interval, since the
            # holder keeps renewing), a jittered moment later.
            wait_s = self._renew_s if ttl_ms < 0 else min(ttl_ms / 1000, self._renew_s)
            state.next_attempt = now + wait_s + self._jitter_s()

    def _renew(self) -> None:
        try:
            renewed = self._seat.lock.renew()
        except Exception:
            log.exception("leader: renewing %s failed", self._seat.lock.key)
            renewed = False
        self._settle(renewed)

    def _settle(self, renewed: bool) -> None:
        """Record a renewal's outcome; a refused or failed one ends the leadership at once."""
        now = self.clock()
        with self._guard:
            state = self._seat
            if not state.leading:
                return
            if renewed:
                state.renewed_at = now
                if now - state.led_since >= self._ttl_s:
                    state.losses = 0
                return
            state.leading = False
            state.losses += 1
            backoff = self._backoff_s(state.losses)
            state.next_attempt = now + backoff
        log.warning(
            "leader: lost %s (%s in a row); its loops stop, trying again in %.1fs",
            state.lock.key,
            state.losses,
            backoff,
        )

    @property
    def _ttl_s(self) -> float:
        return self.ttl.total_seconds()

    @property
    def _renew_s(self) -> float:
        return self.renew_every.total_seconds()

    def _jitter_s(self) -> float:
        return self.rng.uniform(0, self.jitter.total_seconds())

    def _backoff_s(self, losses: int) -> float:
        """Doubling from the renew interval up to the TTL, over its upper half, plus jitter."""
        ceiling = exponential(self.renew_every, 2, losses - 1, self.ttl).total_seconds()
        return self.rng.uniform(ceiling / 2, ceiling) + self._jitter_s()
