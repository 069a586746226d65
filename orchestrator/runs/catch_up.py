"""One store catching up with the other, when the usual write could not do it at once.

- `follow`: Postgres has ended a run and the live hash must follow (`runs.terminal.settle`, and
  `recovery.repair` for a hash left behind). The move is retried while Valkey is unreachable
  (about three seconds, then the hash is left to the repair); a hash of a run Postgres
  cancelled that never heard of the cancel goes cancelling → cancelled; a hash that disagrees
  (lost, moved on by someone else) cannot undo the Postgres write: it is logged, never raised.
- `write_live_claim`: Valkey says a worker runs a run Postgres still calls pending: that
  claim is written to Postgres, as of Valkey's own times.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

from orchestrator.backoff import exponential
from orchestrator.clock import Clock
from orchestrator.states import IllegalTransition, RunState
from orchestrator.stores import durable, live
from orchestrator.stores.durable import ClaimedRun
from orchestrator.stores.live import FencedWrite

log = logging.getLogger(__name__)

# 0.1 s doubling: about three seconds in all before the hash is left to the repair.
FOLLOW_ATTEMPTS = 6
FOLLOW_FIRST_PAUSE = timedelta(seconds=0.1)
FOLLOW_MAX_PAUSE = timedelta(seconds=2)


def follow(
    run_id: str, target: RunState, owner: str, counted: live.EndCount, clock: Clock
) -> live.Ended | None:
    """The move alone, retried while Valkey is unreachable: what the script said, or None
    when the hash did not move."""
    for attempt in range(FOLLOW_ATTEMPTS):
        try:
            return _follow_once(run_id, target, owner, counted, clock)
        except (ValkeyConnectionError, ValkeyTimeoutError) as exc:
            if attempt == FOLLOW_ATTEMPTS - 1:
                log.error(
                    "run %s: %s in Postgres; live hash not updated, Valkey unreachable: %s",
                    run_id,
                    target,
                    exc,
                )
                return None
            pause = exponential(FOLLOW_FIRST_PAUSE, 2, attempt, FOLLOW_MAX_PAUSE)
            time.sleep(pause.total_seconds())
        except Exception:
            # Postgres has the end: a hash Valkey cannot read (a bug, a key of the wrong type)
            # must not keep the hooks from hearing of it; the repair looks at it again.
            log.exception("run %s: %s in Postgres; live hash not updated", run_id, target)
            return None
    return None


def _follow_once(
    run_id: str, target: RunState, owner: str, counted: live.EndCount, clock: Clock
) -> live.Ended | None:
    try:
        return live.end(run_id, target, counted, owner=owner, clock=clock)
    except FencedWrite as exc:
        log.warning("run %s: %s; live hash left to its owner", run_id, exc)
    except IllegalTransition as exc:
        if target == RunState.CANCELLED and exc.current in (RunState.PENDING, RunState.ACTIVE):
            return _cancel_in_two_steps(run_id, owner, counted, clock)
        disagreed(run_id, target, exc)
    return None


def disagreed(run_id: str, target: RunState, exc: IllegalTransition) -> None:
    if exc.current is None:
        log.info("run %s: no live hash to mark %s", run_id, target.value)
    else:
        log.warning("run %s: %s in Postgres, live hash disagreed: %s", run_id, target, exc)


def _cancel_in_two_steps(
    run_id: str, owner: str, counted: live.EndCount, clock: Clock
) -> live.Ended | None:
    """pending|active → cancelling → cancelled: the hash of a run Postgres cancelled, whose
    hash never heard of the cancel request (its signal failed, or the writer died)."""
    try:
        live.transition(run_id, RunState.CANCELLING, owner=owner, clock=clock)
        return live.end(run_id, RunState.CANCELLED, counted, owner=owner, clock=clock)
    except (FencedWrite, IllegalTransition) as exc:
        log.warning("run %s: cancelled in Postgres, live hash moved on: %s", run_id, exc)
        return None


def write_live_claim(run_id: str, owner: str | None = None) -> ClaimedRun | None:
    """Postgres says pending while Valkey says a worker (`owner`, or whichever it names) runs
    the run: that worker's claim is written, started and last heard of when Valkey says. Either
    the claim is not written yet (a short run's is folded into its end:
    `durable.read_claimable`) or its commit, which does not wait for its flush
    (`stores/sql/claim_run.sql`), was lost in a crash of Postgres. Its owner's heartbeat calls
    this (`runs.watch`); so does a cancel, which must reach the handler rather than end the run
    under it (`runs.cancel`), and whoever finds the owner gone, so the lost attempt is counted
    and put back (or failed) as any other (`runs.runner`, `recovery.pending`). None, and nothing
    written, when Valkey does not say so or Postgres no longer calls the run pending."""
    held = live.read(run_id)
    holder = held.get("owner", "")
    if held.get("state") != RunState.ACTIVE or not holder or owner not in (None, holder):
        return None
    started_at = _moment(held.get("started_at"))
    heard_at = _moment(held.get("heartbeat_at")) or started_at
    claimed = durable.claim(run_id, holder, started_at=started_at, heard_at=heard_at)
    if claimed is not None:
        log.info("run %s: claim by %s written to Postgres", run_id, holder)
    return claimed


def _moment(valkey_ms: object) -> datetime | None:
    text = str(valkey_ms or "")
    return datetime.fromtimestamp(int(text) / 1000, tz=UTC) if text.isdigit() else None
