"""Traces (OpenTelemetry): one trace per run, from the request that starts it to its end.

Off unless `LUMASTRA_OTEL` is `console` or `otlp`, or left empty with
`OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set; `OTEL_SDK_DISABLED`
turns it off whatever the rest says. The SDK reads the other standard `OTEL_*` variables itself
(the exporter's headers and protocol, `OTEL_SERVICE_NAME`, the sampler, the batch processor's
delays, the propagators). Every role sets it up at start (`configure`, from `orchestrator.apps`).

Off, this module imports nothing of OpenTelemetry and no span is made: each place that traces
checks `ON` (a module flag: no call) and uses `OFF`, a reusable empty context, so a run executes
no function of this module (`tests/integration/test_footprint.py`).

On, a run's trace is:
- the HTTP request that starts it (Django's instrumentation), when one does;
- `lumastra.start` (`start_run`) with `lumastra.admission` and `lumastra.insert` inside it, and
  `lumastra.publish` when the message is sent (on the start's commit);
- per message a worker takes: `lumastra.queue_wait` (from the message's enqueue time to its
  pickup) and `lumastra.run` or `lumastra.stage` around the pickup, with `lumastra.claim`,
  `lumastra.handler` (a pipeline's stage handlers: `lumastra.stage_handler`),
  `lumastra.process` per `ctx.run_process` command and `lumastra.end` inside it.
The context travels in the message (`traceparent`, W3C, beside Celery's headers), and a run's
row keeps the start's (`trigger.traceparent`), so the messages its later publishers send (a
delayed start's release, a retry, the next stage) join the same trace, and the run's page names
it. The spans carry `lumastra.run_id`, `lumastra.task`, `lumastra.class`, `lumastra.attempt` and,
at the end, `lumastra.outcome`; JSON logs carry `trace_id` and `span_id` (`lumastra.logs`).

Not guaranteed: spans are exported in batches (`OTEL_BSP_SCHEDULE_DELAY`, 5 s): a process
killed before its next export loses those not yet sent; a message the reconciler publishes
again starts a trace of its own.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, cast

# Whether spans are made: set once by `configure`.
ON = False
# The context a place that traces uses when tracing is off.
OFF = contextlib.nullcontext()
# W3C trace context, as OpenTelemetry's propagators write it into a message's headers.
HEADER = "traceparent"
# When the message was sent (ns since the epoch), for the worker's queue-wait span.
SENT_HEADER = "lumastra_sent_ns"
_PROPAGATED = (HEADER, "tracestate")

_tracer: Any = None


@dataclass(frozen=True)
class _Message:
    """The span of the message being run (`received`), and when it was picked up (ns)."""

    span: Any
    picked: int


class Headers(Protocol):
    """A delivered message's headers, as Celery's request hands them over."""

    def get(self, key: str, default: Any = None) -> Any: ...


_Span = contextlib.AbstractContextManager[Any]
_message: ContextVar[_Message | None] = ContextVar("lumastra_message", default=None)


def exporter_mode(setting: str, environ: Mapping[str, str] = os.environ) -> str:
    """What `configure` sets up: `console`, `otlp` or `off`."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "off"
    if setting:
        return setting
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return "otlp" if any(environ.get(name) for name in endpoints) else "off"


def configure(setting: str, instance: str) -> bool:
    """Set up the tracer for this process (`setting`: LUMASTRA_OTEL); whether tracing is on.
    Once per process: a second call changes nothing."""
    global ON, _tracer
    mode = exporter_mode(setting)
    if ON or mode == "off":
        return ON
    from opentelemetry import trace
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    service = os.environ.get("OTEL_SERVICE_NAME") or "lumastra"
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service, SERVICE_INSTANCE_ID: instance})
    )
    if mode == "console":
        # One JSON document per span on stdout, as it ends: for a look, not for production.
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument(tracer_provider=provider)
    _tracer = trace.get_tracer("lumastra")
    ON = True
    return True


def flush() -> None:
    """Export what is waiting (a worker's pool process about to exit)."""
    if ON:
        from opentelemetry import trace

        trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]


def span(
    name: str, attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A span around the block, the current span's child."""
    return cast(_Span, _tracer.start_as_current_span(name, attributes=_clean(attributes)))


def within(name: str, call: Callable[[], None]) -> Callable[[], None]:
    """`call`, made later (on a commit), in a span `name` that is the current span's child."""
    from opentelemetry import context

    parent = context.get_current()

    def traced() -> None:
        with _tracer.start_as_current_span(name, context=parent):
            call()

    return traced


def inject(headers: MutableMapping[str, Any], traceparent: str | None = None) -> None:
    """A message's headers: the current trace context (or `traceparent`'s) and when it was
    sent."""
    if traceparent:
        headers[HEADER] = traceparent
    else:
        from opentelemetry import propagate

        propagate.inject(headers)
    headers[SENT_HEADER] = time.time_ns()


@contextlib.contextmanager
def received(headers: Headers, name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
    """A delivered message's spans: its wait in the queue, then `name` around the block, both
    children of the context the message carries."""
    from opentelemetry import context, propagate, trace

    carried = {key: headers.get(key) for key in _PROPAGATED if headers.get(key) is not None}
    token = context.attach(propagate.extract(carried))
    picked = time.time_ns()
    try:
        sent = headers.get(SENT_HEADER)
        if isinstance(sent, int):
            wait = _tracer.start_span(
                "lumastra.queue_wait", attributes=_clean(attributes), start_time=sent
            )
            wait.end(end_time=picked)
        kind = trace.SpanKind.CONSUMER
        with _tracer.start_as_current_span(
            name, kind=kind, attributes=_clean(attributes), start_time=picked
        ) as message:
            reset = _message.set(_Message(message, picked))
            try:
                yield
            finally:
                _message.reset(reset)
    finally:
        context.detach(token)


def about(
    run_id: str, task: str, resource_class: str, instance: str, stage: str | None = None
) -> dict[str, str]:
    """A message's span attributes: its run, task, class and stage, and the process that runs
    it (a pool process shares its worker's `service.instance.id`)."""
    attributes = {
        "lumastra.run_id": run_id,
        "lumastra.task": task,
        "lumastra.class": resource_class,
        "lumastra.instance": instance,
    }
    return attributes if stage is None else attributes | {"lumastra.stage": stage}


def claimed(attributes: Mapping[str, Any]) -> None:
    """The message's claim is taken: `lumastra.claim`, from its pickup to now (the pre-claim
    hooks, the claim, the row's read when one is needed); `attributes` (the attempt) go on
    the message's span too."""
    if (message := _message.get()) is None:
        return
    cleaned = _clean(attributes)
    message.span.set_attributes(cleaned)
    _tracer.start_span("lumastra.claim", attributes=cleaned, start_time=message.picked).end()


def ending(outcome: str) -> contextlib.AbstractContextManager[Any]:
    """`lumastra.end` around the block that writes how the message's run or stage ended, its
    `outcome` (a state, or `retrying`) on it and on the message's span."""
    attributes = {"lumastra.outcome": outcome}
    if (message := _message.get()) is not None:
        message.span.set_attributes(attributes)
    return span("lumastra.end", attributes)


def annotate(attributes: Mapping[str, Any]) -> None:
    """Attributes of the current span."""
    from opentelemetry import trace

    trace.get_current_span().set_attributes(_clean(attributes))


def current_traceparent() -> str | None:
    """The current span's W3C trace context, to keep with what outlives it (a run's row)."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(HEADER)


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids in hex, for log records; None outside a span."""
    from opentelemetry import trace

    found = trace.get_current_span().get_span_context()
    if not found.is_valid:
        return None
    return f"{found.trace_id:032x}", f"{found.span_id:016x}"


def trace_id(traceparent: object) -> str | None:
    """The trace id a W3C `traceparent` names (`00-<trace id>-<span id>-<flags>`), or None for
    anything else; needs no SDK (a run's page, tracing on or off)."""
    if not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or not _hex(parts[1]) or set(parts[1]) == {"0"}:
        return None
    return parts[1]


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """OpenTelemetry takes no None as an attribute's value: those are left out."""
    return {k: v for k, v in (attributes or {}).items() if v is not None}
