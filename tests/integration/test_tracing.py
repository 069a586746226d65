"""Traces from request to worker (issue 42): runs started over HTTP at the real web role, run by a
real worker, both exporting to a local OTLP/HTTP receiver (`OTEL_EXPORTER_OTLP_ENDPOINT`, as an
operator would set it): one trace per run across the two processes, its spans in order, the
run's attributes on them, the trace id on the run's page and in the worker's JSON log lines.
And tracing off: a process that started and ran a run imported nothing of OpenTelemetry."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs import due
from tasks import registry
from tests.support.fixtures import ROOT, database_url, wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.servers import free_port, web_process
from tests.support.users import operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TASK = "test-traced"  # a log line and a command (`ctx.run_process`); no shared worker
PIPE = "test-pipe"  # probe → left → final (right skipped)
CALLER_SPAN = "00f067aa0ba902b7"  # the span of the caller's own traceparent


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    instance: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


class Receiver:
    """An OTLP/HTTP trace receiver: every span exported to it, decoded."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found = Span(
                        str(resource.get("service.name")),
                        span.name,
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        str(resource.get("service.instance.id")),
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        _attributes(span.attributes),
                    )
                    with self.lock:
                        self.spans.append(found)

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return sorted((s for s in self.spans if s.trace_id == trace_id), key=_started)

    def named(self, name: str, **attributes: Any) -> list[Span]:
        with self.lock:
            return [
                s
                for s in self.spans
                if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
            ]


def _started(span: Span) -> int:
    return span.start_ns


def _attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        value = pair.value
        found[pair.key] = getattr(value, value.WhichOneof("value"))
    return found


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Receiver]]:
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.take(self.rfile.read(int(self.headers["Content-Length"])))
            body = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def _traced_env(endpoint: str) -> dict[str, str]:
    # Exported every 100 ms rather than every 5 s: the test waits for them.
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def web(django_db_setup: None, receiver: tuple[str, Receiver]) -> Iterator[str]:
    with web_process("web-tracing", **_traced_env(receiver[0])) as url:
        yield url


@pytest.fixture
def worker_log(receiver: tuple[str, Receiver]) -> Iterator[Path]:
    """A traced worker for TASK and PIPE writing JSON log lines; its log file."""
    queues = [queue_name(registry.get()[t], settings.CONFIG.per_task_queues) for t in (TASK, PIPE)]
    env = {**_traced_env(receiver[0]), "LUMASTRA_LOG_FORMAT": "json"}
    with worker_process(queues, concurrency=1, name="tracing", env=env):
        yield ROOT / f".pytest_cache/worker-tracing-{os.getpid()}.log"
    empty_queues(*queues)


def _start(web: str, task: str, input: dict[str, Any], delay_s: int = 0) -> tuple[str, str]:
    """A run started over HTTP under a trace of the caller's own (a W3C traceparent header);
    its run id and that trace's id."""
    trace_id = secrets.token_hex(16)
    token = tokens.issue(operator(f"tracer-{trace_id[:8]}"), "http")[1]
    request = urllib.request.Request(
        f"{web}/api/v1/runs",
        data=json.dumps({"task": task, "input": input, "delay_s": delay_s}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
            "traceparent": f"00-{trace_id}-{CALLER_SPAN}-01",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202
        return json.loads(response.read())["run_id"], trace_id


def _ended(run_id: str, state: str) -> bool:
    return TaskHistory.objects.filter(id=run_id, state=state).exists()


def _one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def _within(child: Span, parent: Span) -> None:
    assert child.parent_id == parent.span_id, (child.name, parent.name)
    assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns, child.name


def test_a_run_started_over_http_is_one_trace_from_its_request_to_its_end(
    web: str, worker_log: Path, receiver: tuple[str, Receiver]
) -> None:
    run_id, trace_id = _start(web, TASK, {})
    wait_for(lambda: _ended(run_id, "completed"), timeout=30)
    received = receiver[1]
    wait_for(lambda: any(s.name == "lumastra.end" for s in received.of_trace(trace_id)), 10)
    wait_for(lambda: any(s.name == "lumastra.start" for s in received.of_trace(trace_id)), 10)
    spans = received.of_trace(trace_id)

    # The web role: the request (the caller's span its parent), start_run inside it.
    http = next(s for s in spans if s.parent_id == CALLER_SPAN)
    assert "POST" in http.name
    start = _one(spans, "lumastra.start")
    _within(start, http)
    _within(_one(spans, "lumastra.admission"), start)
    _within(_one(spans, "lumastra.insert"), start)
    publish = _one(spans, "lumastra.publish")
    assert publish.parent_id == start.span_id
    # The worker: the wait in the queue and the message's span, both the publish's children.
    wait, run = _one(spans, "lumastra.queue_wait"), _one(spans, "lumastra.run")
    assert wait.parent_id == run.parent_id == publish.span_id
    assert publish.start_ns <= wait.start_ns <= wait.end_ns <= run.start_ns
    assert run.instance != start.instance  # two processes, one trace
    claim, handler = _one(spans, "lumastra.claim"), _one(spans, "lumastra.handler")
    end, command = _one(spans, "lumastra.end"), _one(spans, "lumastra.process")
    for child in (claim, handler, end):
        _within(child, run)
    _within(command, handler)
    assert claim.end_ns <= handler.start_ns and handler.end_ns <= end.start_ns
    assert command.attributes == {"process.command": "true", "process.exit_code": 0}
    expected = {
        "lumastra.run_id": run_id,
        "lumastra.task": TASK,
        "lumastra.class": "io",
        "lumastra.attempt": 1,
        "lumastra.outcome": "completed",
    }
    assert run.attributes.pop("lumastra.instance").startswith(f"{socket.gethostname()}:")
    assert run.attributes == expected
    assert start.attributes == {
        k: expected[k] for k in ("lumastra.run_id", "lumastra.task", "lumastra.class")
    }

    # The run's page names the trace, and so do the worker's JSON log lines of its handler.
    client = Client()
    client.force_login(operator("trace-reader"))
    page = client.get(f"/admin/orchestrator/taskhistory/{run_id}/change/")
    assert f'<code id="run-trace">{trace_id}</code>' in page.content.decode()
    lines = [
        json.loads(line) for line in worker_log.read_text().splitlines() if line.startswith("{")
    ]
    handler_lines = [line for line in lines if line.get("event") == f"run {run_id}: traced handler"]
    assert len(handler_lines) == 1
    assert handler_lines[0]["trace_id"] == trace_id
    assert handler_lines[0]["span_id"] == handler.span_id


def test_a_failed_run_and_a_pipelines_stages_are_traced_too(
    web: str, worker_log: Path, receiver: tuple[str, Receiver]
) -> None:
    failed, failed_trace = _start(web, TASK, {"fail": True})
    piped, piped_trace = _start(web, PIPE, {"skip_right": True})
    wait_for(lambda: _ended(failed, "failed") and _ended(piped, "completed"), timeout=30)
    received = receiver[1]
    wait_for(lambda: received.named("lumastra.run", **{"lumastra.run_id": failed}), 10)
    wait_for(lambda: len(received.named("lumastra.stage", **{"lumastra.run_id": piped})) == 3, 10)

    run = _one(received.of_trace(failed_trace), "lumastra.run")
    assert run.attributes["lumastra.outcome"] == "failed"
    stages = received.named("lumastra.stage", **{"lumastra.run_id": piped})
    assert {s.trace_id for s in stages} == {piped_trace}
    assert [s.attributes["lumastra.stage"] for s in sorted(stages, key=_started)] == [
        "probe",
        "left",
        "final",
    ]
    for stage in stages:
        assert stage.attributes["lumastra.outcome"] == "completed"
        inside = [s for s in received.of_trace(piped_trace) if s.parent_id == stage.span_id]
        assert sorted(s.name for s in inside) == [
            "lumastra.claim",
            "lumastra.end",
            "lumastra.handler",
        ]


def test_a_delayed_start_released_elsewhere_joins_the_trace_its_start_began(
    web: str, worker_log: Path, receiver: tuple[str, Receiver]
) -> None:
    run_id, trace_id = _start(web, TASK, {}, delay_s=1)
    wait_for(lambda: due.release() == 1, timeout=10)  # this process: not traced
    wait_for(lambda: _ended(run_id, "completed"), timeout=30)
    received = receiver[1]
    wait_for(lambda: received.named("lumastra.run", **{"lumastra.run_id": run_id}), 10)
    run = _one(received.of_trace(trace_id), "lumastra.run")
    assert run.parent_id == _one(received.of_trace(trace_id), "lumastra.start").span_id


def test_untraced_a_process_that_starts_and_runs_a_run_imports_nothing_of_opentelemetry() -> None:
    """The suite's own processes run untraced; one that starts a run and runs it in place
    (the runner's path, as a worker would) has not imported OpenTelemetry at all."""
    script = (
        "import sys, django; django.setup()\n"
        "from orchestrator import tracing\n"
        "from orchestrator.runs.runner import run_message\n"
        "from orchestrator.runs.start import start_run\n"
        "handle = start_run('test-traced', {}, trigger={'kind': 'manual'})\n"
        "run_message('test-traced', handle.run_id, 1)\n"
        "print(tracing.ON, sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "lumastra.settings",
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    empty_queues(queue_name(registry.get()[TASK], settings.CONFIG.per_task_queues))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False []"
