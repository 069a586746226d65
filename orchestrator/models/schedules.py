"""The scheduler's state: one row per schedule it fires (`orchestrator.scheduler`)."""

from __future__ import annotations

from django.db import models


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
    # `pause_on_failure` counts the runs created since then (`scheduler.policies`): set when the
    # schedule is switched back on, so the failures that paused it do not pause it again.
    failures_since = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "scheduler_state"
        verbose_name = "scheduler state"

    def __str__(self) -> str:
        return f"{self.key}: last fired {self.last_fired_at or 'never'}"


class ScheduleOverride(models.Model):
    """An operator's cadence for one schedule (`scheduler.overrides`): a static schedule (key =
    its name, the task id) or one row of a dynamic schedule (key = `<taskId>:<rowKey>`), the
    keys `scheduler_state` uses. Either `cron` (five fields, read in `tz`) or `every_s`. It
    outlives `sync_schedules` and deploys; "reset to the definition" deletes it."""

    key = models.CharField(primary_key=True, max_length=255)
    task_id = models.CharField(max_length=64, db_index=True)
    row_key = models.CharField(max_length=180, blank=True, default="")  # "" for static
    cron = models.CharField(max_length=200, blank=True, default="")
    every_s = models.PositiveIntegerField(null=True, blank=True)
    tz = models.CharField(max_length=64, blank=True, default="")  # "": LUMASTRA_TIME_ZONE
    # Seconds each slot's fire may wait (`orchestrator.slots.jitter`); None: the definition's.
    jitter_s = models.PositiveIntegerField(null=True, blank=True)
    actor = models.CharField(max_length=150)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "schedule_override"
        constraints = [
            models.CheckConstraint(
                condition=(
                    (~models.Q(cron="") & models.Q(every_s__isnull=True))
                    | (models.Q(cron="") & models.Q(every_s__gt=0))
                ),
                name="schedule_override_one_cadence",
            )
        ]

    def __str__(self) -> str:
        cadence = f"cron {self.cron!r}" if self.cron else f"every {self.every_s} s"
        return f"{self.key}: {cadence} (by {self.actor})"


# --- webhooks (orchestrator/webhooks/): run lifecycle events to HTTP endpoints ---
