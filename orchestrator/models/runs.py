"""Every run (`TaskHistory`) and its audit trail (`TaskHistoryAudit`), which Postgres writes
itself, with the run's CloudEvent for the webhook outbox, from triggers on the row."""

from __future__ import annotations

from pathlib import Path

import pgtrigger
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Now

from orchestrator import sql
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
  -- A claim written after it was taken (by its run's watch, a cancel, a retry: the claim was
  -- in Valkey first) carries the claim's own moment, as a folded claim's does.
  INSERT INTO task_history_audit (run_id, from_state, to_state, at)
  VALUES (NEW.id, OLD.state, NEW.state,
          CASE WHEN OLD.state = 'pending' AND NEW.state = 'active'
               THEN LEAST(COALESCE(NEW.started_at, clock_timestamp()), clock_timestamp())
               ELSE clock_timestamp() END);
END IF;
RETURN NULL;
"""  # noqa: S608 (built from the constant above, not from input)


# A followed run's end releases its follow-up (`runs.coalesce`). Its SQL is kept with the
# writer's (`stores/sql`): the one writer of task_history rows (tests/unit/test_one_writer.py).
_RELEASE_FOLLOW_UP = sql.load(
    str(Path(__file__).parents[1] / "stores" / "__init__.py"), "release_follow_up"
)
# A batch's run's end is counted on its batch (`runs.children`), kept with the writer's SQL too.
_COUNT_BATCH_END = sql.load(
    str(Path(__file__).parents[1] / "stores" / "__init__.py"), "count_batch_end"
)
# A dead letter is an operator's notification (`orchestrator.notifications`), written with it.
_NOTIFY_DEAD_LETTER = sql.load(
    str(Path(__file__).parents[1] / "stores" / "__init__.py"), "notify_dead_letter"
)


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
    # What the run was about beyond its input, given at start (`runs.search`): `tag=` finds it.
    tags = ArrayField(models.CharField(max_length=64), default=list, db_default=[], blank=True)
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
    # A pending run waits until this moment: a delayed start (`runs.due` releases it), or a
    # retry's next attempt.
    not_before = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # A child's parent (`ctx.spawn`) and the batch it belongs to (`models.batches`).
    parent_run_id = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001
    batch_id = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001

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
            # Delayed starts not yet released, soonest first: the leader's release loop asks
            # this every LUMASTRA_DUE_POLL_S (`runs.due`).
            models.Index(
                fields=["not_before"],
                name="task_history_due",
                condition=Q(state="pending", attempts=0, not_before__isnull=False),
            ),
            # A run's children (its page, `parent=`, the cancel's cascade) and a batch's runs.
            models.Index(
                fields=["parent_run_id"],
                name="task_history_parent",
                condition=Q(parent_run_id__isnull=False),
            ),
            models.Index(
                fields=["batch_id", "state"],
                name="task_history_batch",
                condition=Q(batch_id__isnull=False),
            ),
            # Runs by what they were about (`runs.search`): equality on top-level input fields
            # (`input @> ...`; jsonb_path_ops: smaller, and containment is all it is asked) and
            # tags (`tags @> ...`).
            GinIndex(fields=["input"], opclasses=["jsonb_path_ops"], name="task_history_input"),
            GinIndex(fields=["tags"], name="task_history_tags"),
        ]
        constraints = [
            # One waiting run per identity of a debounced task: later starts join it
            # (`runs.coalesce`, debounce_run.sql), and two first starts at once make one run.
            models.UniqueConstraint(
                "task_id",
                "identity",
                condition=Q(
                    state="pending",
                    attempts=0,
                    not_before__isnull=False,
                    trigger__has_key="debounce",
                ),
                name="task_history_debounce_one",
            ),
            # One follow-up waits per identity of a follow-up task (`runs.coalesce`,
            # follow_run.sql): later starts give it their input.
            models.UniqueConstraint(
                "task_id",
                "identity",
                condition=Q(state="pending", trigger__has_key="waitsFor"),
                name="task_history_follow_up_one",
            ),
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
            # The end of a followed run makes its follow-up due in the same transaction,
            # whichever path wrote the end (`runs.coalesce`); the due loop publishes it.
            pgtrigger.Trigger(
                name="run_follow_up",
                when=pgtrigger.After,
                operation=pgtrigger.UpdateOf("state"),  # type: ignore[no-untyped-call]
                condition=pgtrigger.Condition(
                    "NEW.trigger ? 'followed' AND OLD.state IS DISTINCT FROM NEW.state"
                    " AND NEW.state IN ('completed', 'failed', 'cancelled')"
                ),
                func=_RELEASE_FOLLOW_UP + ";\nRETURN NULL;",
            ),
            # The end of a batch's run is counted on its batch, in the same transaction.
            pgtrigger.Trigger(
                name="run_batch_count",
                when=pgtrigger.After,
                operation=pgtrigger.UpdateOf("state"),  # type: ignore[no-untyped-call]
                condition=pgtrigger.Condition(
                    "NEW.batch_id IS NOT NULL"
                    " AND OLD.state NOT IN ('completed', 'failed', 'cancelled')"
                    " AND NEW.state IN ('completed', 'failed', 'cancelled')"
                ),
                func=_COUNT_BATCH_END + ";\nRETURN NULL;",
                declare=[("done", "boolean")],
            ),
            pgtrigger.Trigger(
                name="notify_dead_letter",
                when=pgtrigger.After,
                operation=pgtrigger.UpdateOf("state"),  # type: ignore[no-untyped-call]
                condition=pgtrigger.Condition(
                    "NEW.state = 'failed' AND OLD.state IS DISTINCT FROM 'failed'"
                    " AND (NEW.error ->> 'exhausted') = 'true'"
                ),
                func=_NOTIFY_DEAD_LETTER + ";\nRETURN NULL;",
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
