"""Durable state: every run (`TaskHistory`) and its audit trail, the API tokens, the daily
quota usage, circuit and scheduler state, pauses, and the webhook endpoints with their outbox and
deliveries."""

from __future__ import annotations

import pgtrigger
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Now

from orchestrator.states import LIVE_RUN_STATES, RunState

# A claim's end that took its claim with it (end_run.sql: the row still pending, ended for the
# claim's owner; a short run's claim is folded into its end) made two moves in one statement:
# the triggers record both, so the audit and the events show every claim.
_FOLDED_CLAIM = (
    "TG_OP = 'UPDATE' AND OLD.state = 'pending' AND NEW.state IN ('completed', 'failed')"
    " AND NEW.owner_instance_id <> ''"
)

# The CloudEvents 1.0 envelope of a run's change of state (`webhooks.events` reads it); a
# folded claim's `active` first.
_RUN_EVENT = f"""
IF NOT EXISTS (SELECT 1 FROM webhook_endpoint WHERE enabled) THEN RETURN NULL; END IF;
INSERT INTO run_event_outbox (id, envelope, created_at)
SELECT m.id, jsonb_build_object(
    'specversion', '1.0', 'id', m.id, 'source', '/lumastra/runs',
    'type', 'org.lumastra.task.run.' || m.state,
    'time', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'subject', NEW.id, 'datacontenttype', 'application/json',
    'data', jsonb_build_object(
        'run_id', NEW.id, 'task', NEW.task_id, 'state', m.state, 'priority', NEW.priority,
        'trigger', NEW.trigger, 'attempts', NEW.attempts, 'created_at', NEW.created_at,
        'started_at', NEW.started_at,
        'finished_at', CASE WHEN m.step = 1 THEN NULL ELSE NEW.finished_at END,
        'error', CASE WHEN m.step = 1 THEN NULL ELSE NEW.error END)),
    clock_timestamp()
  FROM (SELECT step, state, 'evt_' || replace(gen_random_uuid()::text, '-', '') AS id
          FROM (VALUES (1, 'active'), (2, NEW.state::text)) AS moves(step, state)
         WHERE step = 2 OR ({_FOLDED_CLAIM})) AS m
 ORDER BY m.step;
RETURN NULL;
"""  # noqa: S608 (built from the constant above, not from input)

_AUDIT_UPDATE = f"""
IF {_FOLDED_CLAIM} THEN
  INSERT INTO task_history_audit (run_id, from_state, to_state, at) VALUES
    (NEW.id, 'pending', 'active', LEAST(COALESCE(NEW.started_at, clock_timestamp()),
                                        clock_timestamp())),
    (NEW.id, 'active', NEW.state, clock_timestamp());
ELSE
  INSERT INTO task_history_audit (run_id, from_state, to_state, at)
  VALUES (NEW.id, OLD.state, NEW.state, clock_timestamp());
END IF;
RETURN NULL;
"""  # noqa: S608 (built from the constant above, not from input)


class TaskHistory(models.Model):
    """One row per run; the source of truth the Valkey hashes are reconciled from."""

    id = models.CharField(primary_key=True, max_length=40)  # run_<ulid>
    task_id = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.PENDING)
    stages = models.JSONField(default=dict, blank=True)
    # A pipeline run's stage results by stage name, kept for later stages and for a resume.
    stage_results = models.JSONField(default=dict, blank=True)
    # Step telemetry by step name (a pipeline's stages; a plain run's warnings, counters and
    # cost under its task id): `orchestrator/runs/steps.py` says what a record holds.
    steps = models.JSONField(default=dict, blank=True)
    trigger = models.JSONField(default=dict)  # {"kind": ..., "idempotencyKey": ..., ...}
    input = models.JSONField(default=dict)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)  # {"kind": ..., "message": ...}
    priority = models.PositiveSmallIntegerField()
    identity = models.CharField(max_length=200)
    processing_version = models.PositiveIntegerField(default=1)
    owner_instance_id = models.CharField(max_length=120, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    cost_breakdown = models.JSONField(default=dict, blank=True)
    # The latest progress with its rate and ETA (`runs/progress.py`): forced every 30 s while
    # it changes, and at the end.
    progress = models.JSONField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # A pending run waiting for its next attempt is not taken before this moment.
    not_before = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "task_history"
        verbose_name = "run"
        # No `ordering`: it would add ORDER BY to every lookup by primary key on the run's
        # path (issue 9). Lists order themselves (the admin, the API's pages).
        # Beside Django's view permission, which covers reading (orchestrator/api/access.py).
        permissions = [
            ("operate_taskhistory", "Can start, cancel and retry runs and force-enable circuits")
        ]
        indexes = [
            models.Index(fields=["-created_at"], name="task_history_created"),
            models.Index(fields=["task_id", "-created_at"], name="task_history_task_created"),
            models.Index(fields=["state", "-created_at"], name="task_history_state_created"),
            models.Index(KT("trigger__kind"), "created_at", name="task_history_trigger_kind"),
            # The reconciler's hash repair reads the runs that ended since its last tick.
            models.Index(fields=["finished_at"], name="task_history_finished"),
            # The runs list's priority filter: its page, and its count up to the paginator's
            # cap, from the index alone instead of the whole table.
            models.Index(fields=["priority", "-created_at"], name="task_history_priority_created"),
            # A run's page lists the operator retries that name it (`trigger->>'retryOf'`).
            models.Index(
                KT("trigger__retryOf"),
                name="task_history_retry_of",
                condition=Q(trigger__has_key="retryOf"),
            ),
            # The dead letters (retries exhausted), newest first: the dead-letters page and the
            # runs list's "outcome" filter, without reading every failed run.
            models.Index(
                fields=["-created_at"],
                name="task_history_dead_letters",
                condition=Q(state="failed", error__exhausted=True),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                "task_id",
                KT("trigger__idempotencyKey"),
                condition=Q(state__in=sorted(s.value for s in LIVE_RUN_STATES)),
                name="task_history_live_idempotency_key",
            ),
        ]
        # Every state a run is born in and every change of state, recorded by Postgres itself
        # in task_history_audit (see TaskHistoryAudit), whoever writes the row.
        triggers = [
            pgtrigger.Trigger(
                name="audit_state_insert",
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                func=(
                    "INSERT INTO task_history_audit (run_id, from_state, to_state, at)"
                    " VALUES (NEW.id, NULL, NEW.state, clock_timestamp()); RETURN NULL;"
                ),
            ),
            pgtrigger.Trigger(
                name="audit_state_update",
                when=pgtrigger.After,
                operation=pgtrigger.UpdateOf("state"),  # type: ignore[no-untyped-call]
                condition=pgtrigger.AnyChange("state"),
                func=_AUDIT_UPDATE,
            ),
            # The run's change as a CloudEvent in the webhook outbox, in the same transaction;
            # nothing but a read of the (small) endpoint table while none is enabled.
            pgtrigger.Trigger(
                name="run_event_insert",
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                func=_RUN_EVENT,
            ),
            pgtrigger.Trigger(
                name="run_event_update",
                when=pgtrigger.After,
                operation=pgtrigger.UpdateOf("state"),  # type: ignore[no-untyped-call]
                condition=pgtrigger.AnyChange("state"),
                func=_RUN_EVENT,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.id} ({self.state})"

    @property
    def duration_s(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class TaskHistoryAudit(models.Model):
    """One row per state a run entered, written only by the triggers on task_history.

    An INSERT records (NULL → its first state: `pending`, or `cancelled` for a dropped start);
    an UPDATE that changes `state` records (old → new). Rows are never updated; `id` orders
    the changes of one run, `at` is the Postgres clock at the change (clock_timestamp, so two
    changes in one transaction get two moments). The fault battery checks every pair against
    `orchestrator.states.RUN_TRANSITIONS` (tests/faults/checker.py). Not a foreign key: the
    audit outlives a deleted run, and deleting runs never waits on it.
    """

    run_id = models.CharField(max_length=40, db_index=True)
    # NULL, not "": the trigger writes SQL NULL for the INSERT, which has no previous state.
    from_state = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001
    to_state = models.CharField(max_length=16)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "task_history_audit"
        verbose_name = "run state change"

    def __str__(self) -> str:
        return f"{self.run_id}: {self.from_state or '(new)'} → {self.to_state}"


class ApiToken(models.Model):
    """A bearer token for the HTTP API. Only its SHA-256 digest is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=12)  # shown in the admin to tell tokens apart
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "api_token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class TaskQuotaUsage(models.Model):
    """Per task, per UTC day: how many runs were admitted, completed and failed, and what
    they spent."""

    task_id = models.CharField(max_length=64)
    day = models.DateField()
    started = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    # Units spent by kind (`ctx.spend`), rolled up from Valkey (orchestrator/hooks/costs.py).
    cost = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "task_quota_usage"
        constraints = [
            models.UniqueConstraint("task_id", "day", name="task_quota_usage_task_day"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.day}: {self.started} started"


class CircuitState(models.TextChoices):
    CLOSED = "closed"  # runs are admitted
    OPEN = "open"  # starts are refused until half_open_at
    HALF_OPEN = "half_open"  # one probe run is admitted; its outcome closes or reopens it


class TaskCircuitState(models.Model):
    """Mirror of one task's circuit breaker hash in Valkey (orchestrator/hooks/circuit.py).

    Valkey decides admission; this row is what the hash is rebuilt from when Valkey lost it,
    and what the admin and API read when it is missing there.
    """

    task_id = models.CharField(primary_key=True, max_length=64)
    state = models.CharField(
        max_length=16, choices=CircuitState.choices, default=CircuitState.CLOSED
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    # Times it opened in a row without closing; picks the backoff step.
    reopen_count = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    half_open_at = models.DateTimeField(null=True, blank=True)
    forced_until = models.DateTimeField(null=True, blank=True)
    forced_by = models.CharField(max_length=150, blank=True, default="")
    # The newest counted failures inside the window: [{"at": ms, "run": runId}, ...].
    recent_failures = models.JSONField(default=list, blank=True)
    # The hash's change counter: an upsert never replaces a newer copy with an older one.
    version = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "task_circuit_state"
        verbose_name = "circuit state"

    def __str__(self) -> str:
        return f"{self.task_id}: {self.state}"


class PauseScope(models.TextChoices):
    TASK = "task"  # one task's runs (and its pipeline's stages)
    CLASS = "class"  # every run and stage of one resource class


class TaskPause(models.Model):
    """A pause of a task or resource class (`recovery/pauses.py`), in force until `resumed_at`;
    ended rows stay, so the pending check knows when a resume came."""

    scope = models.CharField(max_length=8, choices=PauseScope.choices)
    name = models.CharField(max_length=64)
    refuse_starts = models.BooleanField(default=False)  # starts answered 503 while paused
    reason = models.TextField(blank=True, default="")
    paused_by = models.CharField(max_length=150)
    paused_at = models.DateTimeField(db_default=Now())
    resumed_by = models.CharField(max_length=150, blank=True, default="")
    resumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "task_pause"
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "name"],
                condition=Q(resumed_at__isnull=True),
                name="task_pause_one_in_force",
            )
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.name}"


class SchedulerState(models.Model):
    """One row per schedule the scheduler fires (`orchestrator.scheduler`): a static schedule
    (key = the task id) or one row of a dynamic schedule (key = `<taskId>:<rowKey>`).

    `last_bucket` is the start of the last slot fired, in epoch seconds; a fire claims its
    slot with one guarded upsert (`last_bucket < slot`), so a slot fires at most once even
    after its Valkey bucket lock expired. Written only by the scheduler."""

    key = models.CharField(primary_key=True, max_length=255)
    task_id = models.CharField(max_length=64, db_index=True)
    row_key = models.CharField(max_length=180, blank=True, default="")  # "" for static
    last_bucket = models.BigIntegerField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_run_id = models.CharField(max_length=40, blank=True, default="")
    # Why the last claimed slot started no run (refused, invalid input); "" when it did.
    last_error = models.TextField(blank=True, default="")
    # The sync disabled this schedule's PeriodicTask (its definition went away); only such a
    # row is enabled again when the definition comes back, never one an operator disabled.
    sync_disabled = models.BooleanField(default=False)
    # An operator disabled this row of a dynamic schedule (`scheduler.switch`): the tick skips
    # it. A static schedule is switched on its PeriodicTask row (`enabled`) instead. A
    # database default: the fire path's upsert (scheduler/sql/claim_slot.sql) does not name
    # the column.
    disabled = models.BooleanField(default=False, db_default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "scheduler_state"
        verbose_name = "scheduler state"

    def __str__(self) -> str:
        return f"{self.key}: last fired {self.last_fired_at or 'never'}"


# --- webhooks (orchestrator/webhooks/): run lifecycle events to HTTP endpoints ---


class WebhookEndpoint(models.Model):
    """Where run events are delivered, signed with `secret` (kept: it signs every delivery)."""

    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100)
    description = models.CharField(max_length=200, blank=True, default="")
    # Event states to deliver (pending, active, cancelling, completed, failed, cancelled);
    # empty: all. Task ids to deliver for; empty: all.
    states = models.JSONField(default=list, blank=True)
    tasks = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "webhook_endpoint"
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        return self.url

    def wants(self, state: str, task_id: str) -> bool:
        return (not self.states or state in self.states) and (
            not self.tasks or task_id in self.tasks
        )


class RunEventOutbox(models.Model):
    """A run's change of state as a CloudEvent, written by a trigger on task_history in the
    change's own transaction (only while some endpoint is enabled); fanned out into
    deliveries by the webhook loop, then deleted."""

    id = models.CharField(primary_key=True, max_length=40)  # the CloudEvent id
    envelope = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "run_event_outbox"
        verbose_name = "run event"

    def __str__(self) -> str:
        return f"{self.envelope.get('type')} {self.envelope.get('subject')}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # to be sent when due
    DELIVERED = "delivered"  # the endpoint answered 2xx
    DEAD = "dead"  # failed LUMASTRA_WEBHOOK_MAX_ATTEMPTS times; redeliver from the admin


class WebhookDelivery(models.Model):
    """One event to one endpoint: its attempts, kept as the endpoint's delivery history."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.CharField(max_length=40)
    event_type = models.CharField(max_length=80)
    run_id = models.CharField(max_length=40)
    envelope = models.JSONField()
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    # A sender holds it until then; past it, another may take it (its sender died).
    leased_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "webhook_delivery"
        verbose_name = "webhook delivery"
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(
                "next_attempt_at",
                name="webhook_delivery_due",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["endpoint", "-created_at"], name="webhook_delivery_history"),
            # The dead letters, newest first (the dead-letters page), without the delivered.
            models.Index(
                fields=["-created_at"],
                name="webhook_delivery_dead",
                condition=Q(status="dead"),
            ),
        ]
        constraints = [
            models.UniqueConstraint("endpoint", "event_id", name="webhook_delivery_once"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.run_id} → {self.endpoint_id}"
