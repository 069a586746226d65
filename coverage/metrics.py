"""The coverage backlog in /metrics (added by `settings.LUMASTRA_METRICS_COLLECTORS`): rows per
stage and status, and each stage's oldest row due now, read at each scrape (`backlog`)."""

from __future__ import annotations

from collections.abc import Iterator

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coverage import backlog


class BacklogCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        rows = GaugeMetricFamily(
            "lumastra_coverage_rows",
            "Item stage rows by covered stage and status",
            labels=["stage", "status"],
        )
        waiting = GaugeMetricFamily(
            "lumastra_coverage_oldest_due_seconds",
            "Age of each covered stage's oldest row due now (0: none)",
            labels=["stage"],
        )
        now = timezone.now()
        for stage in backlog.overview():
            for status, count in stage.counts.items():
                rows.add_metric([stage.stage, status], count)
            oldest = stage.oldest_due_at
            waiting.add_metric(
                [stage.stage], 0.0 if oldest is None else (now - oldest).total_seconds()
            )
        yield rows
        yield waiting
