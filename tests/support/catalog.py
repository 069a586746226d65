"""Catalog rows and queue hygiene for the coverage tests."""

from __future__ import annotations

import dataclasses

from django.conf import settings

from coverage.models import MediaFile, MediaFileItem, MediaItem
from orchestrator.routing import class_queues
from orchestrator.stores import broker, keys
from tasks import RESOURCE_CLASSES, registry


def movie(title: str = "movie", *, file: bool = True, missing: bool = False) -> MediaItem:
    """A movie, with one file (present, or missing from disk) unless `file=False`."""
    item = MediaItem.objects.create(kind="movie", library="Movies", title=title)
    if file:
        found = MediaFile.objects.create(
            path=f"/media/{item.pk}-{title}.mkv", size=1, is_missing=missing
        )
        MediaFileItem.objects.create(file=found, item=item)
    return item


# The stages the coverage tests drive; the demo's stages keep their rows but start nothing.
TEST_STAGES = ("test-probe", "test-albums", "test-season")


def only_test_stages_driven() -> None:
    """Only the test stages start runs: a fixture calling this puts settings.COVERAGE back."""
    settings.COVERAGE = dataclasses.replace(settings.COVERAGE, authoritative_stages=TEST_STAGES)


def empty_queues() -> None:
    """Drop the messages waiting in the covering tasks' queues: runs a coverage test started
    and no worker took, which would otherwise push a later test's class over the sweep's depth
    threshold."""
    per_task = settings.CONFIG.per_task_queues
    queues = {
        queue
        for resource_class in RESOURCE_CLASSES
        for queue in class_queues(registry.get().values(), resource_class, per_task)
    }
    broker.client().delete(
        *(keys.broker_queue(q, step) for q in queues for step in keys.BROKER_PRIORITY_STEPS)
    )
