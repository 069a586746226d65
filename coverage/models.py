"""Catalog-side tables: the EPG sources the demo's dynamic schedule reads, and the media
catalog stand-in (items, files, their links, external ids) that per-item coverage works on."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models


class EpgSource(models.Model):
    """An electronic programme guide feed, refreshed by the `epg-refresh` task.

    Each enabled source is one row of that task's dynamic schedule (`schedule=dynamic(...)`):
    it is refreshed every `interval_minutes`, on its own cadence. Edit them in the admin; the
    scheduler sees a change at its next tick (10 s)."""

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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "media_items"
        indexes = [
            models.Index(fields=["kind"], name="media_items_kind"),
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

    def __str__(self) -> str:
        return f"{self.kind} {self.title}"


class MediaFile(models.Model):
    """A file on disk that holds (part of) one or more items."""

    path = models.CharField(max_length=1000, unique=True)
    size = models.BigIntegerField()
    is_missing = models.BooleanField(default=False)  # was there, is gone from disk
    probed_at = models.DateTimeField(null=True, blank=True)
    content_hash = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "media_files"

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

    def __str__(self) -> str:
        return f"{self.provider}:{self.value}"
