"""One `/metrics` scrape from a test: computed afresh (no cache), its samples by name and labels."""

from __future__ import annotations

import dataclasses

from django.conf import settings
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


def scrape() -> dict[tuple[str, Labels], float]:
    """Every sample of one scrape, keyed by (name, its labels sorted)."""
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, metrics_token="t", metrics_cache_s=0)
    try:
        text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    finally:
        settings.CONFIG = config
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
