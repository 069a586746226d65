"""Catalog-side tables: the EPG sources the demo's dynamic schedule reads, and the media
catalog stand-in (items, files, their links, external ids) that per-item coverage works on."""

from __future__ import annotations

import pgtrigger
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models.functions import Now

from orchestrator import sql


class EpgSource(models.Model):
    """An electronic programme guide feed: one row of `epg-refresh`'s dynamic schedule, refreshed
    every `interval_minutes`; the scheduler sees an edit at its next tick (10 s)."""

    slug = models.SlugField(unique=True, max_length=80)
    name = models.CharField(max_length=200)
    url = models.URLField(max_length=500)
    interval_minutes = models.PositiveIntegerField(default=60, validators=[MinValueValidator(1)])
    enabled = models.BooleanField(default=True)
    last_refreshed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "epg_source"
        verbose_name = "EPG source"
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


# --- the media catalog (a stand-in for the media server's own; the engine never imports it) ---

# Each catalog change that can change what an item needs is written to `event_outbox` by a
# trigger, in the change's transaction (`coverage.dispatcher` reads them); statement-level, with
# transition tables: a bulk insert of a million items writes its events in one statement.


_TRANSITION_TABLES = {
    pgtrigger.Insert: {"new": "new_rows"},
    pgtrigger.Delete: {"old": "old_rows"},
    pgtrigger.Update: {"old": "old_rows", "new": "new_rows"},
}


def _outbox_trigger(name: str, operation: pgtrigger.Operation, body: str) -> pgtrigger.Trigger:
    return pgtrigger.Trigger(
        name=name,
        level=pgtrigger.Statement,
        when=pgtrigger.After,
        operation=operation,
        referencing=pgtrigger.Referencing(**_TRANSITION_TABLES[operation]),  # type: ignore[no-untyped-call]
        func=body + " RETURN NULL;",
    )


# A child added or removed: its parent hears of it (an event, and `children_changed_at`).
_CHILDREN_CHANGED = (
    " INSERT INTO event_outbox (kind, item_id)"
    " SELECT DISTINCT 'children.changed', parent_id FROM {rows} WHERE parent_id IS NOT NULL;"
    " UPDATE media_items SET children_changed_at = now()"
    " WHERE id IN (SELECT parent_id FROM {rows} WHERE parent_id IS NOT NULL);"
)


class ItemKind(models.TextChoices):
    MOVIE = "movie"  # a film; stands alone
    SERIES = "series"  # a show; holds seasons
    SEASON = "season"  # one season of a series; holds episodes
    EPISODE = "episode"  # one episode of a season
    ALBUM = "album"  # a music album; holds tracks
    TRACK = "track"  # one track of an album


# Which kind each kind hangs under; the others stand alone.
PARENT_KIND = {
    ItemKind.SEASON: ItemKind.SERIES,
    ItemKind.EPISODE: ItemKind.SEASON,
    ItemKind.TRACK: ItemKind.ALBUM,
}


class MediaItem(models.Model):
    """Something a library shows: a movie, a series and its seasons and episodes, an album
    and its tracks. Coverage stages decide per item what still needs processing."""

    kind = models.CharField(max_length=16, choices=ItemKind.choices)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    library = models.CharField(max_length=80)
    title = models.CharField(max_length=300)
    year = models.PositiveSmallIntegerField(null=True, blank=True)
    # The episode's, season's or track's number within its parent.
    index_number = models.PositiveIntegerField(null=True, blank=True)
    # When a child (an episode of a season, say) was last added or removed; kept by a trigger.
    children_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "media_items"
        indexes = [
            # By kind in id order: the sweep's self-heal reads a kind's items after a watermark.
            models.Index(fields=["kind", "id"], name="media_items_kind_id"),
            models.Index(fields=["library", "kind"], name="media_items_library_kind"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(kind__in=list(PARENT_KIND), parent__isnull=False)
                    | (~models.Q(kind__in=list(PARENT_KIND)) & models.Q(parent__isnull=True))
                ),
                name="media_items_parent_by_kind",
                violation_error_message="seasons, episodes and tracks have a parent; "
                "movies, series and albums have none",
            ),
        ]
        triggers = [
            _outbox_trigger(
                "items_created",
                pgtrigger.Insert,
                "INSERT INTO event_outbox (kind, item_id)"  # noqa: S608 (a constant table name)
                " SELECT 'item.created', id FROM new_rows;"
                + _CHILDREN_CHANGED.format(rows="new_rows"),
            ),
            _outbox_trigger(
                "items_deleted",
                pgtrigger.Delete,
                _CHILDREN_CHANGED.format(rows="old_rows"),
            ),
            _outbox_trigger(
                "items_edited",
                pgtrigger.Update,
                "INSERT INTO event_outbox (kind, item_id)"
                " SELECT 'item.metadata_changed', n.id FROM new_rows n JOIN old_rows o USING (id)"
                " WHERE (n.title, n.year, n.library, n.index_number)"
                " IS DISTINCT FROM (o.title, o.year, o.library, o.index_number);",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.title}"


class MediaFile(models.Model):
    """A file on disk that holds (part of) one or more items."""

    path = models.CharField(max_length=1000, unique=True)
    size = models.BigIntegerField()
    # Its last write, as the library scan saw it (`coverage.library`): a new one is a rewrite.
    mtime = models.DateTimeField(null=True, blank=True)
    is_missing = models.BooleanField(default=False)  # was there, is gone from disk
    probed_at = models.DateTimeField(null=True, blank=True)
    # What the last probe (`media-probe`, ffprobe) found: the length and each stream's type
    # and codec (and a video's size), so later stages need not probe again.
    duration_s = models.FloatField(null=True, blank=True)
    streams = models.JSONField(null=True, blank=True)
    content_hash = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "media_files"
        indexes = [
            # A folder's files (`coverage.library`): a path prefix, compared byte by byte.
            models.Index(
                fields=["path"], name="media_files_path_prefix", opclasses=["varchar_pattern_ops"]
            ),
        ]
        triggers = [
            _outbox_trigger(
                "files_changed",
                pgtrigger.Update,
                sql.load(__file__, "files_changed"),
            ),
        ]

    def __str__(self) -> str:
        return self.path


class MediaFileItem(models.Model):
    """Which file holds which item (a file may hold several episodes; an item several parts)."""

    file = models.ForeignKey(MediaFile, on_delete=models.CASCADE, related_name="links")
    item = models.ForeignKey(MediaItem, on_delete=models.CASCADE, related_name="file_links")

    class Meta:
        db_table = "media_file_items"
        constraints = [
            models.UniqueConstraint("file", "item", name="media_file_items_file_item"),
        ]
        triggers = [
            _outbox_trigger(
                "links_created",
                pgtrigger.Insert,
                "INSERT INTO event_outbox (kind, item_id)"
                " SELECT 'file.linked', item_id FROM new_rows;",
            ),
            _outbox_trigger(
                "links_deleted",
                pgtrigger.Delete,
                "INSERT INTO event_outbox (kind, item_id)"
                " SELECT 'file.unlinked', item_id FROM old_rows;",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.file_id} ↔ {self.item_id}"


class ExternalId(models.Model):
    """An item's id at a metadata provider (tmdb, imdb, tvdb, musicbrainz, …)."""

    item = models.ForeignKey(MediaItem, on_delete=models.CASCADE, related_name="external_ids")
    provider = models.CharField(max_length=40)
    value = models.CharField(max_length=200)

    class Meta:
        db_table = "external_ids"
        constraints = [
            models.UniqueConstraint("item", "provider", name="external_ids_item_provider"),
        ]
        indexes = [models.Index(fields=["provider", "value"], name="external_ids_provider_value")]
        triggers = [
            _outbox_trigger(
                f"external_ids_{name}",
                operation,
                "INSERT INTO event_outbox (kind, item_id)"  # noqa: S608 (a constant table name)
                f" SELECT DISTINCT 'external_id.changed', item_id FROM {rows};",
            )
            for name, operation, rows in (
                ("created", pgtrigger.Insert, "new_rows"),
                ("edited", pgtrigger.Update, "new_rows"),
                ("deleted", pgtrigger.Delete, "old_rows"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.value}"


# --- per-item coverage: which items still need which stage ---


class CoverageStatus(models.TextChoices):
    PENDING = "pending"  # needs the stage; the sweep starts its run when it is due
    RUNNING = "running"  # a run (`run_id`) holds it
    COMPLETED = "completed"  # done, by `processing_version`
    FAILED_TRANSIENT = "failed_transient"  # failed; tried again from `next_eligible_at`
    FAILED_PERMANENT = "failed_permanent"  # failed in a way a retry will not mend
    SKIPPED_PERMANENT = "skipped_permanent"  # not to be processed (`reason`)
    SKIPPED_TRANSIENT = "skipped_transient"  # not now (`reason`); asked again later
    OBSOLETE = "obsolete"  # completed by an older processing_version; to be done again


# The statuses the sweep picks candidates from, once `next_eligible_at` has come.
DUE_STATUSES = (
    CoverageStatus.PENDING,
    CoverageStatus.OBSOLETE,
    CoverageStatus.FAILED_TRANSIENT,
    CoverageStatus.SKIPPED_TRANSIENT,
)


class CoverageStage(models.Model):
    """One row per covered stage the registry declares: what the sweep last knew of it."""

    id = models.CharField(primary_key=True, max_length=64)
    task_id = models.CharField(max_length=64)
    # The covering task's processing_version the stage's completed rows were checked against.
    processing_version = models.PositiveIntegerField(default=0)
    # Items up to this id have their row (the sweep's self-heal resumes after it).
    seeded_through = models.BigIntegerField(default=0)
    # Where the sweep's heal pass over skipped rows resumes.
    heal_cursor = models.BigIntegerField(default=0)
    last_tick = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "coverage_stage"

    def __str__(self) -> str:
        return self.id


class MediaItemStageState(models.Model):
    """Where one item stands with one stage. Runs move it: a per-item run's insert marks it
    `running`, its terminal write records the outcome, both by triggers on task_history in the
    same transaction (migrations 0004 and 0006)."""

    item = models.ForeignKey(
        MediaItem, on_delete=models.CASCADE, related_name="stage_states", db_index=False
    )
    stage = models.CharField(max_length=64)
    status = models.CharField(
        max_length=20, choices=CoverageStatus.choices, db_default=CoverageStatus.PENDING.value
    )
    reason = models.CharField(max_length=200, blank=True, db_default="")
    run_id = models.CharField(max_length=40, blank=True, db_default="")  # the last run
    processing_version = models.PositiveIntegerField(null=True, blank=True)
    failures = models.PositiveIntegerField(db_default=0)  # transient failures in a row
    # The item changed while its run was going: the run's end sends the row back to pending.
    rerun_requested = models.BooleanField(db_default=False)
    next_eligible_at = models.DateTimeField(db_default=Now())
    last_error = models.TextField(blank=True, db_default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "media_item_stage_state"
        verbose_name = "item stage state"
        constraints = [
            models.UniqueConstraint("stage", "item", name="stage_state_stage_item"),
        ]
        indexes = [
            # The sweep's candidates: due rows of a stage, oldest first.
            models.Index(
                "stage",
                "next_eligible_at",
                "id",
                name="stage_state_due",
                condition=models.Q(status__in=[s.value for s in DUE_STATUSES]),
            ),
            # The heal pass, walking skipped rows by id.
            models.Index(
                "stage",
                "id",
                name="stage_state_skipped",
                condition=models.Q(status=CoverageStatus.SKIPPED_PERMANENT),
            ),
            # Wedged rows: running for long.
            models.Index(
                "started_at",
                name="stage_state_running",
                condition=models.Q(status=CoverageStatus.RUNNING),
            ),
            models.Index("run_id", name="stage_state_run"),
            # Backlog counts per stage and status (an index-only scan), and the admin's rows of
            # one stage and status, newest first (its drill-down).
            models.Index("stage", "status", "id", name="stage_state_status_id"),
        ]
        # The backlog's counts per stage and status, kept as it changes (`coverage.counts`):
        # each statement appends one delta row per (stage, status) it changed, net.
        triggers = [
            _outbox_trigger(
                "stage_counts_inserted",
                pgtrigger.Insert,
                "INSERT INTO coverage_stage_count_delta (stage, status, delta)"
                " SELECT stage, status, count(*) FROM new_rows GROUP BY stage, status;",
            ),
            _outbox_trigger(
                "stage_counts_deleted",
                pgtrigger.Delete,
                "INSERT INTO coverage_stage_count_delta (stage, status, delta)"
                " SELECT stage, status, -count(*) FROM old_rows GROUP BY stage, status;",
            ),
            # Every update, not only of status or stage: PostgreSQL refuses transition tables on
            # a trigger with a column list. Rows whose status and stage stay net to zero.
            _outbox_trigger(
                "stage_counts_updated",
                pgtrigger.Update,
                "INSERT INTO coverage_stage_count_delta (stage, status, delta)"
                " SELECT stage, status, sum(d) FROM ("
                " SELECT stage, status, 1 AS d FROM new_rows"
                " UNION ALL SELECT stage, status, -1 FROM old_rows) AS moved"
                " GROUP BY stage, status HAVING sum(d) <> 0;",
            ),
            # A TRUNCATE fires no delete trigger: the counts start again from nothing.
            pgtrigger.Trigger(
                name="stage_counts_truncated",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Truncate,
                func="DELETE FROM coverage_stage_count; DELETE FROM coverage_stage_count_delta;"
                " RETURN NULL;",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.stage} {self.item_id}: {self.status}"


class CoverageStageCount(models.Model):
    """The backlog's rows per stage and status as of the last fold; the rows changed since are
    in `CoverageStageCountDelta`. Read, folded and recounted by `coverage.counts` only."""

    stage = models.CharField(max_length=64)
    status = models.CharField(max_length=20)
    n = models.BigIntegerField()

    class Meta:
        db_table = "coverage_stage_count"
        constraints = [models.UniqueConstraint("stage", "status", name="coverage_stage_count_key")]

    def __str__(self) -> str:
        return f"{self.stage} {self.status}: {self.n}"


class CoverageStageCountDelta(models.Model):
    """A change to the counts by one statement on `media_item_stage_state`, appended by its
    triggers (no shared row for concurrent ends to queue on), folded by the stage-sweep."""

    id = models.BigAutoField(primary_key=True)
    stage = models.CharField(max_length=64)
    status = models.CharField(max_length=20)
    delta = models.BigIntegerField()

    class Meta:
        db_table = "coverage_stage_count_delta"

    def __str__(self) -> str:
        return f"{self.stage} {self.status}: {self.delta:+d}"


class EventOutbox(models.Model):
    """A catalog change, written by a trigger in the change's transaction and read by the
    dispatcher (`coverage.dispatcher`), which deletes it once handled."""

    kind = models.CharField(max_length=40)
    item_id = models.BigIntegerField()  # no foreign key: the item may be gone by dispatch
    created_at = models.DateTimeField(db_default=Now())
    attempts = models.PositiveIntegerField(db_default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    last_error = models.TextField(blank=True, db_default="")
    dead_at = models.DateTimeField(null=True, blank=True)  # dead-lettered after its attempts

    class Meta:
        db_table = "event_outbox"
        verbose_name = "outbox event"
        indexes = [
            models.Index(
                "next_attempt_at",
                "id",
                name="event_outbox_due",
                condition=models.Q(dead_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.item_id}"
