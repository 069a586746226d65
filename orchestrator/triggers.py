"""What started a run, and the priority that follows from it when nothing else says."""

from __future__ import annotations

from enum import Enum

from tasks.definition import Priority


class TriggerKind(Enum):
    OPERATOR_RETRY = "operator-retry"  # an operator re-ran a failed run
    API = "api"  # the HTTP API
    ADMIN = "admin"  # the Django admin's start form
    MANUAL = "manual"  # Python code calling start_run directly
    EVENT = "event"  # a reaction to a catalog or external event
    SCHEDULE = "schedule"  # celery beat or the dynamic scheduler
    PIPELINE = "pipeline"  # a parent run advancing its stages
    CHILD = "child"  # spawned by a parent run's step (`ctx.spawn`)
    SYSTEM = "system"  # demo, maintenance and backfills
    WEBHOOK = "webhook"  # an integration's inbound trigger, POST /api/v1/triggers/<name>


PRIORITY_BY_TRIGGER: dict[TriggerKind, Priority] = {
    TriggerKind.OPERATOR_RETRY: Priority.OPERATOR,
    TriggerKind.API: Priority.INTERACTIVE,
    TriggerKind.ADMIN: Priority.INTERACTIVE,
    TriggerKind.MANUAL: Priority.INTERACTIVE,
    TriggerKind.EVENT: Priority.EVENT,
    TriggerKind.PIPELINE: Priority.EVENT,
    TriggerKind.CHILD: Priority.EVENT,  # its parent's priority, unless the spawn names one
    # Something just happened elsewhere (a download finished) and the caller is a program,
    # not a person waiting: as urgent as our own events.
    TriggerKind.WEBHOOK: Priority.EVENT,
    TriggerKind.SCHEDULE: Priority.SCHEDULED,
    TriggerKind.SYSTEM: Priority.BACKGROUND,
}
