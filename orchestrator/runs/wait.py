"""Waiting for a run's result, from any process: `handle.wait(timeout)`, `run_and_wait(...)`
and the API's `POST /runs?wait=`.

The waiter subscribes to `<namespace>:task:ended:<runId>` (published with every run's end by
its script, `end_run.lua`), then reads the run's row: an end that lands between the two is
seen by the read, one after it wakes the waiter at once. Without a message the row is read
again every RECHECK_S (a missed message, a run ended while Valkey was away), never in a tight loop.

A completed run returns its result; a failed or cancelled one raises `RunFailed` with its
state, error kind and message; no end within the timeout raises `TimeoutError`, and the run
goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from redis.client import PubSub
from redis.exceptions import RedisError

from orchestrator.models import TaskHistory
from orchestrator.states import TERMINAL_RUN_STATES, RunState
from orchestrator.stores import keys, valkey

RECHECK_S = 5.0
POLL_WITHOUT_VALKEY_S = 0.5
log = logging.getLogger(__name__)
_TERMINAL = {state.value for state in TERMINAL_RUN_STATES}


class RunFailed(Exception):
    """The run ended failed or cancelled."""

    def __init__(self, run_id: str, state: str, error: Mapping[str, Any] | None) -> None:
        self.run_id = run_id
        self.state = state
        self.kind = (error or {}).get("kind", "")
        self.error_message = (error or {}).get("message", "")
        super().__init__(f"run {run_id} {state}: {self.kind or '-'}: {self.error_message}")


def ended(run_id: str, timeout: float) -> TaskHistory | None:
    """The run's row once it has ended, or None if it has not within `timeout` seconds. A row
    not committed yet (a deduplicated start's) is a run that has not ended; with Valkey out
    of reach the row is read every POLL_WITHOUT_VALKEY_S instead of on the end's message."""
    pubsub = _subscribed(run_id)
    try:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            row = (
                TaskHistory.objects.filter(id=run_id).only("id", "state", "result", "error").first()
            )
            if row is not None and row.state in _TERMINAL:
                return row
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            pubsub = _wait_for_message(pubsub, run_id, min(left, RECHECK_S))
    finally:
        if pubsub is not None:
            pubsub.close()


def _subscribed(run_id: str) -> PubSub | None:
    try:
        pubsub: PubSub = valkey.client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        pubsub.subscribe(keys.run_ended(run_id))  # type: ignore[no-untyped-call]
        return pubsub
    except RedisError as exc:
        log.warning("run %s: waiting without Valkey (%s); polling the row", run_id, exc)
        return None


def _wait_for_message(pubsub: PubSub | None, run_id: str, seconds: float) -> PubSub | None:
    if pubsub is None:
        time.sleep(min(seconds, POLL_WITHOUT_VALKEY_S))
        return None
    try:
        pubsub.get_message(timeout=seconds)
        return pubsub
    except RedisError as exc:
        log.warning("run %s: waiting without Valkey (%s); polling the row", run_id, exc)
        pubsub.close()
        return None


def wait(run_id: str, timeout: float) -> Any:
    """The run's result once it completes; raises RunFailed or TimeoutError."""
    row = ended(run_id, timeout)
    if row is None:
        raise TimeoutError(f"run {run_id} did not end within {timeout}s; it goes on")
    if row.state != RunState.COMPLETED:
        raise RunFailed(run_id, row.state, row.error)
    return row.result
