"""Publishing a run's message to its queue (the last step of `start_run`'s write order).

The message is the one `celery.send_task` would send (Celery's task protocol 2: the same
task name, id, args, retries, eta and priority a worker reads), built directly: `send_task`
routes, copies options, `saferepr`s the arguments and goes through kombu's producer, which
opens a new Redis client for every message, all for a message whose queue and contents are
already known here. Celery's `before_task_publish` and `after_task_publish` signals are sent
as its producer sends them. `tests/integration/test_publish.py` holds the two side by side.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from celery.signals import after_task_publish, before_task_publish
from django.conf import settings

from orchestrator import tracing
from orchestrator.hooks import keyed
from orchestrator.routing import queue_name, stage_queue, task_queue
from orchestrator.stores import broker, live
from tasks.definition import TaskDefinition
from tasks.pipeline import Stage

# The longest a message waits in the broker for a retry; a longer backoff takes several hops,
# so a worker that dies holding a delayed message strands it for seconds, not an hour.
MAX_BROKER_DELAY = timedelta(seconds=10)
# The header that carries a run's admission notes to its pickup (`hooks.base.Admission.notes`);
# Celery hands unknown headers to the task as `request.<name>`, and older workers ignore it.
HOOK_HEADER = "lumastra_notes"
# The message body's third part: no callbacks, errbacks, chain or chord (Celery's "embed").
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
# A run's first message carries what its pickup would read of the row (`Carried`) when its
# input is at most this long as JSON; a longer one is read at pickup, as a retry's is.
CARRY_MAX_CHARS = 8192
# What Flower shows of the carried input, as Celery's own `argsrepr_maxsize` does.
KWARGS_REPR_MAX = 1024


class Carried(TypedDict):
    """What a run's first message carries for its pickup (`runs.runner`), so a first delivery
    reads nothing before its end: the input, identity and priority the row was inserted with."""

    input: dict[str, Any]
    identity: str
    priority: int


def carried(
    definition: TaskDefinition, input: dict[str, Any], identity: str, priority: int
) -> Carried | None:
    """What a plain run's first message carries of its row; None for a pipeline run (its
    stages are claimed against the row) or an input too long to carry."""
    if definition.pipeline or len(json.dumps(input)) > CARRY_MAX_CHARS:
        return None
    return Carried(input=input, identity=identity, priority=priority)


@dataclass(frozen=True)
class Outgoing:
    """One run's first message, for `publish_many`."""

    definition: TaskDefinition
    run_id: str
    job_id: str
    priority: int
    notes: Mapping[str, bool] | None = None
    # The version the run was recorded for, when not the current one's: a run older than the
    # deploy that publishes it is failed `stale_version` at pickup, not run by newer code.
    processing_version: int | None = None
    # What its first message carries of the row (`carried`), for a start's own message.
    sheet: Carried | None = None
    # A keyed-concurrency run's key: it is published when its key's turn comes (`hooks.keyed`).
    concurrency_key: str | None = None
    # The trace its start began (`trigger.traceparent`), for a publisher outside it.
    traceparent: str | None = None


def stage_task_name(task_id: str, stage: str) -> str:
    """The Celery task of one pipeline stage: what Flower and worker logs show."""
    return f"{task_id}.{stage}"


def stage_message_id(run_id: str, stage: str) -> str:
    """What a stage message's id ends with after its `#` (see `publish_stage`)."""
    return f"{run_id}.{stage}"


def publish(
    definition: TaskDefinition,
    run_id: str,
    job_id: str,
    priority: int,
    *,
    delay: timedelta | None = None,
    notes: Mapping[str, bool] | None = None,
    sheet: Carried | None = None,
    version: int | None = None,
) -> None:
    """Enqueue the run; with `delay`, a worker holds the message until then (Celery's eta);
    `notes`: what the admission's hooks asked its pickup to be told; `sheet`: what a first
    message carries of the row (`carried`); `version`: the processing version the run was
    recorded for, when not this deploy's."""
    queue = task_queue(definition.id, definition.resource_class, settings.CONFIG.per_task_queues)
    args = [run_id, definition.processing_version if version is None else version]
    kwargs: dict[str, object] = {} if sheet is None else {"carried": sheet}
    # `_send`'s three steps, inline: a call less on every start's path (test_footprint).
    message, sent = _message(definition.id, args, queue, job_id, priority, delay, notes, kwargs)
    broker.push(*message)
    sent()


def republish(
    definition: TaskDefinition,
    run_id: str,
    identity: str,
    priority: int,
    delay: timedelta,
    notes: Mapping[str, bool] | None = None,
) -> None:
    """The run's message again, later (a retry, a postponed pickup), at most
    MAX_BROKER_DELAY ahead; a postponed first delivery keeps its admission's notes, a retry
    carries none (`hooks.base.Pickup.notes`)."""
    publish(
        definition,
        run_id,
        broker.job_id(definition.id, identity, run_id),
        priority,
        delay=min(delay, MAX_BROKER_DELAY),
        notes=notes,
    )


def publish_stage(
    definition: TaskDefinition,
    stage: Stage,
    run_id: str,
    identity: str,
    priority: int,
    delay: timedelta | None = None,
) -> None:
    """Enqueue one stage of a pipeline run, on the queue of the stage's class; with `delay`,
    a worker holds the message until then (a retry's backoff)."""
    queue = stage_queue(definition, stage, settings.CONFIG.per_task_queues)
    args = [run_id, definition.processing_version]
    _send(
        stage_task_name(definition.id, stage.name),
        args,
        queue,
        broker.job_id(definition.id, identity, stage_message_id(run_id, stage.name)),
        priority,
        delay,
    )


def publish_many(runs: Sequence[Outgoing]) -> None:
    """`publish` for many runs (`start_runs`, the release of delayed starts): their messages
    in one round trip to the broker; keyed-concurrency runs wait for their turns."""
    if any(run.concurrency_key is not None for run in runs):
        runs = _take_turns(runs)
    per_task_queues = settings.CONFIG.per_task_queues
    messages = [
        _message(
            run.definition.id,
            [run.run_id, _version(run)],
            queue_name(run.definition, per_task_queues),
            run.job_id,
            run.priority,
            None,
            run.notes,
            {} if run.sheet is None else {"carried": run.sheet},
            run.traceparent,
        )
        for run in runs
    ]
    broker.push_many([message for message, _ in messages])
    for _, sent in messages:
        sent()


def publish_turns(definition: TaskDefinition, runs: Sequence[keyed.Dispatched]) -> None:
    """The runs whose key's turn came (`hooks.keyed`), published. One run, the common case (a
    start, a pickup, an end), goes as `publish` sends it: one LPUSH, no pipeline."""
    if len(runs) == 1:
        run = runs[0]
        publish(definition, run.run_id, run.job_id, run.priority, version=run.version)
    elif runs:
        publish_many([_turn(definition, run) for run in runs])


def _turn(definition: TaskDefinition, run: keyed.Dispatched) -> Outgoing:
    return Outgoing(
        definition, run.run_id, run.job_id, run.priority, processing_version=run.version
    )


def _take_turns(runs: Sequence[Outgoing]) -> list[Outgoing]:
    """The runs to publish now: those of no keyed concurrency, and the keyed runs whose turn
    came as they were registered (one round trip per task)."""
    now: list[Outgoing] = []
    waiting: dict[str, list[Outgoing]] = {}
    for run in runs:
        if run.concurrency_key is None:
            now.append(run)
        else:
            waiting.setdefault(run.definition.id, []).append(run)
    for task_runs in waiting.values():
        definition = task_runs[0].definition
        registered = [
            keyed.Registered(r.run_id, r.concurrency_key or "", r.priority, r.job_id, _version(r))
            for r in task_runs
        ]
        now += [_turn(definition, turn) for turn in keyed.enqueue(definition, registered)]
    return now


def seed_and_publish_many(runs: Sequence[Outgoing]) -> None:
    """The first messages of runs not seeded in Valkey yet (a batch's, the delayed starts due,
    a resume's), in DESIGN's order: their live hashes in one round trip (a hash still there is
    left as it is), then their messages in one."""
    live.seed_many(
        [live.Seed(r.run_id, r.definition.id, r.priority, r.definition.stage_order) for r in runs]
    )
    publish_many(runs)


def _version(run: Outgoing) -> int:
    if run.processing_version is None:
        return run.definition.processing_version
    return run.processing_version


def _kwargs_repr(kwargs: dict[str, object]) -> str:
    text = repr(kwargs)
    return text if len(text) <= KWARGS_REPR_MAX else text[: KWARGS_REPR_MAX - 3] + "..."


def _send(
    task_name: str,
    args: list[object],
    queue: str,
    job_id: str,
    priority: int,
    delay: timedelta | None,
    notes: Mapping[str, bool] | None = None,
) -> None:
    message, sent = _message(task_name, args, queue, job_id, priority, delay, notes)
    broker.push(*message)
    sent()


def _message(
    task_name: str,
    args: list[object],
    queue: str,
    job_id: str,
    priority: int,
    delay: timedelta | None,
    notes: Mapping[str, bool] | None,
    kwargs: dict[str, object] | None = None,
    traceparent: str | None = None,
) -> tuple[broker.Message, Callable[[], None]]:
    """The message as Celery's protocol 2 has it, after `before_task_publish`; and what to
    call once it is sent (`after_task_publish`). Traced, it carries the current trace context,
    or `traceparent`'s (a run's start, for a publisher outside its trace)."""
    eta = (datetime.now(UTC) + delay).isoformat() if delay and delay > timedelta(0) else None
    headers: dict[str, object] = {
        "lang": "py",
        "task": task_name,
        "id": job_id,
        "shadow": None,
        "eta": eta,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": job_id,
        "parent_id": None,
        # What Flower and worker logs show; a run id and a version need no `saferepr`.
        "argsrepr": repr(args),
        "kwargsrepr": _kwargs_repr(kwargs or {}),
        # Celery's anonymous node name for a publisher that is not a worker.
        "origin": f"gen{os.getpid()}@{socket.gethostname()}",
        "ignore_result": False,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    if notes:
        headers[HOOK_HEADER] = dict(notes)
    if tracing.ON:
        tracing.inject(headers, traceparent)
    elif traceparent:
        # A traced start's run sent by a process that traces nothing: its worker joins it.
        headers[tracing.HEADER] = traceparent
    properties: dict[str, object] = {"correlation_id": job_id, "reply_to": ""}
    message: tuple[list[object], dict[str, object], dict[str, None]] = (args, kwargs or {}, _EMBED)
    # Celery's publish signals, as its producer sends them, for whoever listens (monitoring,
    # tracing headers, tests); an unwatched signal costs one check.
    if before_task_publish.receivers:
        before_task_publish.send(
            sender=task_name,
            body=message,
            exchange="",
            routing_key=queue,
            declare=[],
            headers=headers,
            properties=properties,
            retry_policy=None,
        )

    def sent() -> None:
        if after_task_publish.receivers:
            after_task_publish.send(
                sender=task_name, body=message, headers=headers, exchange="", routing_key=queue
            )

    return broker.Message(queue, priority, headers, properties, json.dumps(message)), sent
