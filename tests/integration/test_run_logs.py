"""A run's live log on real processes: a worker runs a handler that logs (through `ctx.log`
and its own `logging` calls), the web role serves the log over Server-Sent Events, and a
client follows it, disconnects, resumes with Last-Event-ID and sees `end`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from django.conf import settings

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs import context
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.round_trips import recording
from tests.support.servers import web_process
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TASK = "test-logger"


@pytest.fixture
def web() -> Iterator[str]:
    with web_process("web-logs", LUMASTRA_SSE_KEEPALIVE_S="1") as url:
        yield url


@pytest.fixture
def worker() -> Iterator[object]:
    queue = queue_name(registry.get()[TASK], settings.CONFIG.per_task_queues)
    with worker_process([queue], concurrency=1, name="logger") as process:
        yield process


def _token_session(base_url: str) -> requests.Session:
    _, secret = tokens.issue(operator("logs-reader"), "logs test")
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {secret}"
    return session


def _events(
    session: requests.Session, url: str, *, stop_after: int | None = None, **headers: str
) -> list[dict[str, Any]]:
    """The SSE events of `url` as dicts (`id`, `event`, `data`, or `comment`), until the stream
    ends or `stop_after` log events were read (then the client hangs up)."""
    found: list[dict[str, Any]] = []
    event: dict[str, Any] = {}
    with session.get(url, stream=True, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for raw in response.iter_lines(decode_unicode=True):
            if raw == "":
                if event:
                    found.append(event)
                    logged = [e for e in found if e.get("event") == "log"]
                    if stop_after is not None and len(logged) >= stop_after:
                        return found
                    if event.get("event") == "end":
                        return found
                event = {}
            elif raw.startswith(":"):
                found.append({"comment": raw[1:].strip()})
            else:
                name, _, value = raw.partition(": ")
                event[name] = json.loads(value) if name == "data" else value
    return found


def test_a_client_follows_a_runs_log_resumes_without_gap_or_repeat_and_sees_the_end(
    web: str, worker: object
) -> None:
    handle = start_run(TASK, {"lines": 30, "pause_s": 0.1}, trigger=TriggerKind.API)
    session = _token_session(web)
    url = f"{web}/api/v1/runs/{handle.run_id}/logs"

    first = _events(session, url, stop_after=10)
    last_seen = [e for e in first if e.get("event") == "log"][-1]["id"]
    rest = _events(session, url, **{"Last-Event-ID": last_seen})

    logged = [e for e in first + rest if e.get("event") == "log"]
    seqs = [int(e["id"]) for e in logged]
    assert seqs == list(range(1, len(seqs) + 1))  # no gap, no repeat
    messages = [e["data"]["msg"] for e in logged]
    assert [m for m in messages if m.startswith("line ")] == [f"line {n}" for n in range(30)]
    # The handler's own logging call, captured for its run.
    assert "tests.logger: through logging, at the end" in messages
    assert all(e["data"]["level"] in ("info", "warning") for e in logged)
    assert rest[-1]["event"] == "end" and rest[-1]["data"] == {"state": "completed"}


def test_a_quiet_run_keeps_its_stream_alive(web: str, worker: object) -> None:
    handle = start_run(TASK, {"lines": 2, "pause_s": 2.5}, trigger=TriggerKind.API)

    events = _events(_token_session(web), f"{web}/api/v1/runs/{handle.run_id}/logs")

    assert {"comment": "keep-alive"} in events  # LUMASTRA_SSE_KEEPALIVE_S=1 here
    assert events[-1]["event"] == "end"


def test_follow_false_answers_json_and_an_old_runs_log_comes_from_its_row(
    web: str, worker: object
) -> None:
    handle = start_run(TASK, {"lines": 5, "pause_s": 0}, trigger=TriggerKind.API)
    wait_for(lambda: TaskHistory.objects.get(id=handle.run_id).state == RunState.COMPLETED)
    session = _token_session(web)
    url = f"{web}/api/v1/runs/{handle.run_id}/logs?follow=false"

    live = session.get(url, timeout=10).json()
    assert [line["seq"] for line in live] == list(range(1, len(live) + 1))
    documented = session.get(f"{web}/api/v1/openapi.json", timeout=10).json()
    line_schema = documented["components"]["schemas"]["LogLine"]
    assert all(
        set(line_schema["required"]) <= set(line) <= set(line_schema["properties"]) for line in live
    )
    assert {"line 0", "line 4"} <= {line["msg"] for line in live}

    # A day later the live log is gone: the tail kept on the row answers.
    valkey.client().delete(keys.run_log(handle.run_id))
    kept = session.get(url, timeout=10).json()
    assert [line["msg"] for line in kept] == [line["msg"] for line in live]
    ended = _events(session, f"{web}/api/v1/runs/{handle.run_id}/logs")
    assert ended[-1]["event"] == "end"


def test_bad_requests_for_a_log_get_clear_errors(web: str) -> None:
    session = _token_session(web)

    assert session.get(f"{web}/api/v1/runs/run_nope/logs", timeout=10).status_code == 404
    handle = start_run("test-noop", {}, trigger=TriggerKind.API)
    bad = session.get(
        f"{web}/api/v1/runs/{handle.run_id}/logs",
        headers={"Last-Event-ID": "yesterday"},
        timeout=10,
    )
    assert bad.status_code == 422
    assert requests.get(f"{web}/api/v1/runs/{handle.run_id}/logs", timeout=10).status_code == 401


def test_lines_are_sent_in_batches_not_one_round_trip_each() -> None:
    run_log = context.RunLog("run_batching")
    with recording() as recorded:
        for n in range(250):
            run_log.write("info", f"line {n}")
        run_log.flush()

    # 250 lines in batches of LUMASTRA_LOG_FLUSH_LINES (100): three round trips.
    assert recorded.counts().valkey == 3

    stored = context.read_log("run_batching")
    assert [line.seq for line in stored] == list(range(1, 251))
    assert stored[-1].entry["msg"] == "line 249"
    assert len(run_log.tail) == settings.CONFIG.run_log_tail


def test_a_handlers_logging_goes_to_its_own_run_only() -> None:
    import logging
    import threading

    first, second = context.RunLog("run_capture_one"), context.RunLog("run_capture_two")
    started = threading.Barrier(2)

    def handler(run_log: context.RunLog, name: str) -> None:
        with context.capturing(run_log):
            started.wait(5)  # both runs capture at the same time, in their own threads
            logging.getLogger("tests.capture").warning("from %s", name)
            # The engine's own records are the engine's, never a run's.
            logging.getLogger("orchestrator.capture").warning("engine talk")
        run_log.flush()

    threads = [
        threading.Thread(target=handler, args=(first, "one")),
        threading.Thread(target=handler, args=(second, "two")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logging.getLogger("tests.capture").warning("outside any run")

    assert [line.entry["msg"] for line in context.read_log("run_capture_one")] == [
        "tests.capture: from one"
    ]
    assert [line.entry["msg"] for line in context.read_log("run_capture_two")] == [
        "tests.capture: from two"
    ]
