"""Waiting for a run's result on a real worker: the result, the failure, the timeout (the run
goes on), and the API's `POST /runs?wait=`."""

from __future__ import annotations

import threading
import time

import pytest
from django.test import Client

from orchestrator.api import tokens
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.start import run_and_wait, start_run
from orchestrator.runs.wait import RunFailed
from orchestrator.triggers import TriggerKind
from tests.support.round_trips import recording
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_wait_returns_the_result(celery_worker: object) -> None:
    handle = start_run(
        "slow-progress", {"steps": 2, "step_seconds": 0.1}, trigger=TriggerKind.MANUAL
    )

    assert handle.wait(timeout=30) == {"steps": 2}


def test_run_and_wait_raises_the_failure(celery_worker: object) -> None:
    with pytest.raises(RunFailed) as failed:
        run_and_wait("test-fail", {"how": "permanent"}, timeout=30)

    assert failed.value.state == "failed"
    assert failed.value.kind == "permanent"
    assert "asked to fail as permanent" in failed.value.error_message


def test_a_wait_that_times_out_leaves_the_run_going(celery_worker: object) -> None:
    handle = start_run(
        "slow-progress", {"steps": 10, "step_seconds": 0.3}, trigger=TriggerKind.MANUAL
    )

    began = time.monotonic()
    with pytest.raises(TimeoutError, match="it goes on"):
        handle.wait(timeout=0.5)
    assert time.monotonic() - began < 3

    assert handle.wait(timeout=30) == {"steps": 10}  # it went on, and ended


def test_a_waiter_wakes_on_the_end_not_on_a_poll(celery_worker: object) -> None:
    parked = start_run(
        "slow-progress", {"steps": 4, "step_seconds": 0.5}, trigger=TriggerKind.MANUAL
    )

    with recording() as recorded:
        parked.wait(timeout=30)

    # One read before the end, one after it woke: not one per poll interval of a busy loop.
    assert recorded.counts().postgres <= 3


def test_run_and_wait_refuses_to_wait_inside_a_transaction() -> None:
    from django.db import transaction

    with transaction.atomic(), pytest.raises(StartRefused, match="inside a transaction"):
        run_and_wait("test-noop", {}, timeout=1)


def _api() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator(), 'wait')[1]}"})


def test_the_api_answers_the_end_when_it_comes_in_time(celery_worker: object) -> None:
    api = _api()

    done = api.post(
        "/api/v1/runs?wait=30",
        {"task": "slow-progress", "input": {"steps": 2, "step_seconds": 0}},
        content_type="application/json",
    )
    failed = api.post(
        "/api/v1/runs?wait=30",
        {"task": "test-fail", "input": {"how": "permanent"}},
        content_type="application/json",
    )
    slow = api.post(
        "/api/v1/runs?wait=0.5",
        {"task": "slow-progress", "input": {"steps": 10, "step_seconds": 0.3}},
        content_type="application/json",
    )
    too_long = api.post(
        "/api/v1/runs?wait=3600", {"task": "test-noop"}, content_type="application/json"
    )

    assert done.status_code == 200
    assert (done.json()["state"], done.json()["result"]) == ("completed", {"steps": 2})
    assert failed.status_code == 200 and failed.json()["state"] == "failed"
    assert failed.json()["error"]["kind"] == "permanent"
    assert slow.status_code == 202 and slow.json()["result"] is None
    assert too_long.status_code == 422


def test_many_waiters_share_one_end(celery_worker: object) -> None:
    handle = start_run(
        "slow-progress", {"steps": 3, "step_seconds": 0.2}, trigger=TriggerKind.MANUAL
    )
    results: list[object] = []

    def waiter() -> None:
        try:
            results.append(handle.wait(timeout=30))
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=waiter) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [{"steps": 3}] * 5
