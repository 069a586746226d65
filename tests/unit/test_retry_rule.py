"""The one retry rule (`runs.retries.decide`) as a state table: each kind of failure at each
attempt, for a task that takes runs back after a lost worker and one that does not."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.runs import retries
from tasks import Retry
from tasks.errors import ErrorKind

POLICY = Retry(max_attempts=3, base=timedelta(seconds=1), cap=timedelta(seconds=10))
T, P = ErrorKind.TRANSIENT, ErrorKind.PERMANENT
LOST, ORPHAN = ErrorKind.WORKER_LOST, ErrorKind.ORPHANED
RETRY, DEAD, FAIL = "retry", "dead letter", "fail"

# kind, attempt, retry_on_worker_loss → what happens
TABLE = [
    (T, 1, True, RETRY),
    (T, 2, False, RETRY),  # a transient error retries whatever the worker-loss option
    (T, 3, True, DEAD),
    (LOST, 1, True, RETRY),
    (ORPHAN, 2, True, RETRY),
    (LOST, 3, True, DEAD),
    (ORPHAN, 3, True, DEAD),
    (LOST, 1, False, FAIL),  # work that must not repeat fails as lost, not as a dead letter
    (P, 1, True, FAIL),
    (ErrorKind.FATAL, 1, True, FAIL),
    (ErrorKind.TIMEOUT, 1, True, FAIL),
    (ErrorKind.STALLED, 3, True, FAIL),
]


@pytest.mark.parametrize(("kind", "attempt", "takes_back", "expected"), TABLE)
def test_each_failure_retries_fails_or_is_a_dead_letter(
    kind: ErrorKind, attempt: int, takes_back: bool, expected: str
) -> None:
    decision = retries.decide(kind, "boom", attempt, POLICY, retry_on_worker_loss=takes_back)
    error = decision.error

    assert error["kind"] == kind.value
    if expected == RETRY:
        assert decision.delay is not None and timedelta(0) < decision.delay <= POLICY.cap
        assert f"boom (attempt {attempt} of 3; retrying in " in error["message"]
        assert "exhausted" not in error
    elif expected == DEAD:
        assert decision.delay is None
        assert error["message"] == f"boom (attempts exhausted: {attempt} of 3)"
        assert error["exhausted"] is True
    else:
        assert decision.delay is None
        assert (error["message"], "exhausted" in error) == ("boom", False)
    assert retries.may_retry(kind, attempt, POLICY, retry_on_worker_loss=takes_back) is (
        expected == RETRY
    )


def test_extra_fields_join_the_error_and_a_long_message_keeps_its_note() -> None:
    decision = retries.decide(
        T, "x" * 10_000, 3, POLICY, retry_on_worker_loss=True, stage="probe", attempt=3
    )

    assert decision.error["stage"] == "probe" and decision.error["attempt"] == 3
    assert len(decision.error["message"]) == 4000
    assert decision.error["message"].endswith("x (attempts exhausted: 3 of 3)")
