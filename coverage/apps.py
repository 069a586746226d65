from django.apps import AppConfig


class CoverageConfig(AppConfig):
    """The media catalog stand-in and, with issue 11, per-item pipeline coverage."""

    name = "coverage"
    label = "coverage"
