"""What admission keeps in Postgres per task: daily quota usage, the circuit's copy, and the
pauses of tasks and resource classes."""

from __future__ import annotations

from pathlib import Path

import pgtrigger
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from orchestrator import sql

# A circuit that opens is an operator's notification (`orchestrator.notifications`), written with
# its copy; the SQL is kept with the writers' (`stores/sql`).
_NOTIFY_CIRCUIT_OPEN = sql.load(
    str(Path(__file__).parents[1] / "stores" / "__init__.py"), "notify_circuit_open"
)


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
        triggers = [
            pgtrigger.Trigger(
                name="notify_circuit_open",
                when=pgtrigger.After,
                operation=pgtrigger.Insert | pgtrigger.Update,
                condition=pgtrigger.Condition("NEW.state = 'open'"),
                func=_NOTIFY_CIRCUIT_OPEN + ";\nRETURN NULL;",
            ),
        ]

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


class RunWindow(models.Model):
    """An operator's run window for a task or a resource class (`orchestrator.windows`): it
    takes the place of the window the code or the environment gives that scope, until it is
    removed. Its fields are those of `tasks.window.Window`."""

    scope = models.CharField(max_length=8, choices=PauseScope.choices)
    name = models.CharField(max_length=64)
    span = models.CharField(max_length=11)  # HH:MM-HH:MM
    days = models.CharField(max_length=40)
    tz = models.CharField(max_length=64, blank=True, default="")  # "": LUMASTRA_TIME_ZONE
    on_close = models.CharField(max_length=8)
    actor = models.CharField(max_length=150)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "run_window"
        constraints = [
            models.UniqueConstraint(fields=["scope", "name"], name="run_window_one_per_scope")
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.name}: {self.span} {self.days}"
