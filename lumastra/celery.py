"""The Celery application: broker settings from Django, one Celery task per registered task."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")

app = Celery("lumastra")
app.config_from_object("django.conf:settings", namespace="CELERY")
