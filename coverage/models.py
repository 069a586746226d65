"""Catalog-side tables. Today: the EPG sources the demo's dynamic schedule reads."""

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
