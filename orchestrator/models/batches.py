"""Batches of runs: the children one step spawned (`ctx.spawn`), or a caller's `start_runs(...,
batch=Batch(...))`. Their runs name the batch (`task_history.batch_id`); each one's end is
counted here by a trigger on task_history in the same transaction (`runs.children`)."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class OnFailure(models.TextChoices):
    FAIL_PARENT = "fail_parent"  # the first child that does not complete fails the wait
    CONTINUE = "continue"  # the waiting stage runs once all are terminal, and sees the failures


class RunBatch(models.Model):
    id = models.CharField(primary_key=True, max_length=40)  # batch_<ulid>
    # The run whose step spawned the batch, and that step (its stage; '' for a plain run).
    parent_run_id = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001
    parent_stage = models.CharField(max_length=64, blank=True, default="")
    on_failure = models.CharField(
        max_length=16, choices=OnFailure.choices, default=OnFailure.CONTINUE
    )
    # A later stage of the parent awaits these children (`Stage(await_children=True)`).
    awaited = models.BooleanField(default=False)
    total = models.PositiveIntegerField()
    # Runs of the batch not yet ended; the trigger counts each end once (the end's guarded
    # write changes the state once), so duplicates and replays cannot count twice.
    open = models.PositiveIntegerField()
    counts = models.JSONField(default=dict, blank=True)  # ended runs by their state
    # A resume's batch (`runs.spawn.reuse`): the original batches whose completed runs it
    # keeps as its own (counted completed in `total` and `counts`), the original's first.
    reused_from = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    # The callbacks' start requests (`Batch`), and the runs they became.
    on_complete = models.JSONField(null=True, blank=True)
    on_success = models.JSONField(null=True, blank=True)
    callbacks = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set by the trigger when the last run ends, or the first failure of a fail_parent batch.
    done_at = models.DateTimeField(null=True, blank=True)
    # Set by the release that acted on it (`runs.children.release`): once.
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "run_batches"
        indexes = [
            models.Index(
                fields=["parent_run_id", "parent_stage"],
                name="run_batches_parent",
                condition=Q(parent_run_id__isnull=False),
            ),
            # /metrics' live children: the batches with runs not yet ended.
            models.Index(
                fields=["parent_run_id"], name="run_batches_open", condition=Q(open__gt=0)
            ),
            # The leader's release loop: what is done and not yet acted on.
            models.Index(
                fields=["done_at"],
                name="run_batches_to_release",
                condition=Q(done_at__isnull=False, released_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.total - self.open} of {self.total} ended)"
