from django.apps import AppConfig


class CoverageConfig(AppConfig):
    """Per-item pipeline coverage (media_item_stage_state); tables arrive with their issue."""

    name = "coverage"
    label = "coverage"
