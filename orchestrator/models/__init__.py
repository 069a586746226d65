"""Durable state, one module per concern; every model is importable from here.

- `runs`: every run (`TaskHistory`) and its audit trail, kept by triggers on the row
- `batches`: batches of runs (`RunBatch`): a step's children, a caller's batch with callbacks
- `tokens`: the API's bearer tokens, as digests
- `admission`: per task: daily quota usage, the circuit's copy, pauses of tasks and classes
- `schedules`: the scheduler's state, one row per schedule it fires, and operators' cadences
- `webhooks`: webhook endpoints, the run events' outbox and each delivery
- `notifications`: the notifications an operator receives, each event's row and its sends
"""

from orchestrator.models.admission import (
    CircuitState,
    PauseScope,
    RunWindow,
    TaskCircuitState,
    TaskPause,
    TaskQuotaUsage,
)
from orchestrator.models.batches import OnFailure, RunBatch
from orchestrator.models.notifications import (
    Notification,
    NotificationKind,
    NotificationStatus,
)
from orchestrator.models.runs import TaskHistory, TaskHistoryAudit
from orchestrator.models.schedules import ScheduleOverride, SchedulerState
from orchestrator.models.tokens import ApiToken
from orchestrator.models.webhooks import (
    DeliveryStatus,
    RunEventOutbox,
    WebhookDelivery,
    WebhookEndpoint,
)

__all__ = [
    "ApiToken",
    "CircuitState",
    "DeliveryStatus",
    "Notification",
    "NotificationKind",
    "NotificationStatus",
    "OnFailure",
    "PauseScope",
    "RunBatch",
    "RunEventOutbox",
    "RunWindow",
    "ScheduleOverride",
    "SchedulerState",
    "TaskCircuitState",
    "TaskHistory",
    "TaskHistoryAudit",
    "TaskPause",
    "TaskQuotaUsage",
    "WebhookDelivery",
    "WebhookEndpoint",
]
