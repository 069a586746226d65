"""Publishing a run's message to its queue (the last step of DESIGN §1's write order)."""

from __future__ import annotations

from datetime import timedelta

from celery import current_app
from django.conf import settings

from orchestrator.routing import queue_name
from tasks.definition import TaskDefinition


def job_id(task_id: str, identity: str, run_id: str) -> str:
    """The message id: names the work (task and identity) and the run that does it."""
    return f"{task_id}~~{identity}#{run_id}"


def publish(
    definition: TaskDefinition,
    run_id: str,
    job_id: str,
    priority: int,
    *,
    delay: timedelta | None = None,
) -> None:
    current_app.send_task(
        definition.id,
        args=[run_id, definition.processing_version],
        task_id=job_id,
        queue=queue_name(definition, settings.CONFIG.per_task_queues),
        priority=priority,
        countdown=delay.total_seconds() if delay else None,
    )
