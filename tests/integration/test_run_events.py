"""`GET /events` on real processes: a client follows a run's state changes and progress as a
worker runs it, then resumes from a Last-Event-ID without a gap or a repeat."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from orchestrator.api import tokens
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind
from tests.support.servers import web_process
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def web() -> Iterator[str]:
    with web_process("web-events") as url:
        yield url


def _session() -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {tokens.issue(operator(), 'events')[1]}"
    return session


def _read(
    stream: requests.Response | Iterator[str],
    until: Any,
    found: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Events of an open stream (a response, or its one line iterator when read in several
    goes) until `until(event)` holds."""
    found = [] if found is None else found
    event: dict[str, Any] = {}
    lines = (
        stream.iter_lines(decode_unicode=True) if isinstance(stream, requests.Response) else stream
    )
    for raw in lines:
        if raw == "":
            if event:
                found.append(event)
                if until(event):
                    return found
            event = {}
        elif not raw.startswith(":"):
            name, _, value = raw.partition(": ")
            event[name] = json.loads(value) if name == "data" else value
    return found


def test_a_client_follows_a_run_and_resumes_from_the_last_id(
    web: str, celery_worker: object
) -> None:
    session = _session()
    url = f"{web}/api/v1/events?task=slow-progress"
    with session.get(url, stream=True, timeout=60) as stream:
        assert stream.status_code == 200
        ready = threading.Event()
        handle_box: list[str] = []

        def start() -> None:
            ready.wait(5)
            handle = start_run(
                "slow-progress", {"steps": 3, "step_seconds": 0.4}, trigger=TriggerKind.API
            )
            handle_box.append(handle.run_id)

        starter = threading.Thread(target=start)
        starter.start()
        ready.set()
        events = _read(
            stream,
            lambda e: e.get("event") == "run" and e["data"]["state"] == "completed",
        )
        starter.join()

    run_id = handle_box[0]
    mine = [e for e in events if e["data"]["run_id"] == run_id]
    states = [e["data"]["state"] for e in mine if e["event"] == "run"]
    assert states == ["pending", "active", "completed"]
    assert all(e["data"]["task"] == "slow-progress" for e in mine if e["event"] == "run")
    progress = [e for e in mine if e["event"] == "progress"]
    assert progress and progress[-1]["data"]["progress"]["total"] == 3

    first_id = next(e["id"] for e in mine if e["event"] == "run")
    with session.get(
        f"{web}/api/v1/events?run={run_id}",
        headers={"Last-Event-ID": first_id},
        stream=True,
        timeout=60,
    ) as resumed:
        again = _read(
            resumed, lambda e: e.get("event") == "run" and e["data"]["state"] == "completed"
        )
    assert [e["data"]["state"] for e in again if e["event"] == "run"] == ["active", "completed"]


def test_bad_requests_for_events_get_clear_errors(web: str) -> None:
    session = _session()

    assert session.get(f"{web}/api/v1/events?task=no-such-task", timeout=10).status_code == 404
    assert session.get(f"{web}/api/v1/events?run=run_nope", timeout=10).status_code == 404
    bad = session.get(f"{web}/api/v1/events", headers={"Last-Event-ID": "x"}, timeout=10)
    assert bad.status_code == 422
    assert requests.get(f"{web}/api/v1/events", timeout=10).status_code == 401


def test_a_change_that_commits_late_still_reaches_the_stream(web: str) -> None:
    session = _session()
    holding, release = threading.Event(), threading.Event()
    late: list[str] = []

    def slow_transaction() -> None:
        from django.db import connection, transaction

        try:
            with transaction.atomic():
                # Its audit row takes an id now and becomes visible only at the commit.
                handle = start_run("test-unique", {"key": "late"}, trigger=TriggerKind.API)
                late.append(handle.run_id)
                holding.set()
                release.wait(20)
        finally:
            connection.close()

    # A read timeout under the keep-alive interval: a late change that never comes fails here.
    with session.get(f"{web}/api/v1/events", stream=True, timeout=10) as s:
        thread = threading.Thread(target=slow_transaction)
        thread.start()
        assert holding.wait(10)
        early = start_run("test-record-order", {"label": "early"}, trigger=TriggerKind.API)
        lines = s.iter_lines(decode_unicode=True)
        seen = _read(lines, lambda e: e.get("data", {}).get("run_id") == early.run_id)
        release.set()
        thread.join()
        seen = _read(lines, lambda e: e.get("data", {}).get("run_id") == late[0], seen)

    order = [
        e["data"]["run_id"]
        for e in seen
        if e.get("event") == "run" and e["data"]["run_id"] in (early.run_id, *late)
    ]
    assert order == [early.run_id, late[0]]  # the late one arrives after, not never
    ids = {e["data"]["run_id"]: int(e["id"]) for e in seen if e.get("event") == "run"}
    assert ids[late[0]] < ids[early.run_id]  # it did commit out of id order
