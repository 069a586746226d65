"""What a run's end is made of, as `runs.terminal.finish` takes and answers it: who may end it
(`Guard`), the end a writer asks for (`End`, with what is written with it: `WrittenWith`), the
drain's replay of one (`Replay`), and what the end found (`Written`, `Ended`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

from django.utils import timezone

from orchestrator.states import RunState


class Guard(Enum):
    """Who may end the run, as the Postgres statement checks it."""

    CLAIM = "claim"  # the claim's own end (fenced by its owner), or a run no claim started
    ORPHAN = "orphan"  # the reconciler's: only while the heartbeat is still stale
    PENDING_DEADLINE = "pending deadline"  # the reconciler's: only while still pending that long


class Written(Enum):
    """What `finish` found."""

    APPLIED = "applied"  # Postgres holds this end now; settled
    ALREADY = "already"  # a replay: this very end was in Postgres (its reply was lost); settled
    CANCELLED = "cancelled"  # a cancel request won: the run ended cancelled; settled
    SUPERSEDED = "superseded"  # the run ended otherwise, moved on, or is another claim's now
    DEFERRED = "deferred"  # Postgres away: the end waits in the drain, whose replay settles it
    # Postgres away and the end carries children, which cannot wait in the drain: nothing is
    # written, and the orphan check puts the run back.
    UNWRITTEN = "unwritten"


@dataclass(frozen=True)
class End:
    """One end of one run, as its writer asks for it. `target` is completed, failed or
    cancelled; `owner` the claim ending it ('' for none). A claim's end names its `attempt`
    (the count the claim returned) and `started_at`, so it also lands if Postgres has not
    heard of the claim (`durable.end`). `stale_after_s`: the orphan's heartbeat age, or how
    long the pending run has waited, that the reconciler judged it by."""

    run_id: str
    task_id: str  # '' to read it from the run's row when needed (the drain's replay)
    target: RunState
    owner: str = ""
    error: dict[str, Any] | None = None
    result: Any = None
    step: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    attempt: int | None = None
    started_at: datetime | None = None
    finished_at: datetime = field(default_factory=timezone.now)
    guard: Guard = Guard.CLAIM
    stale_after_s: float = 0.0
    # Written in the end's own transaction when it lands (a run's spawned children).
    children: WrittenWith | None = None


class WrittenWith(Protocol):
    def write(self) -> None: ...

    def abandon(self) -> None: ...


@dataclass(frozen=True)
class Ended:
    written: Written
    state: RunState | None  # the run's state as this end left or found it


@dataclass(frozen=True)
class Replay:
    """The drain's replay of an end (`recovery.drain_replay`): the write in the replay's
    transaction, a transient error raised to it, and `landed` telling its own lost reply from
    another writer's end."""

    transaction: Callable[[], AbstractContextManager[None]]
    landed: Callable[[], bool]
