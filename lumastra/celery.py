"""The Celery application, its settings from Django's (namespace CELERY_); the Celery tasks are
registered by `orchestrator.apps` (`runs.celery_tasks.register_all`), one per task and stage."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")

app = Celery("lumastra")
app.config_from_object("django.conf:settings", namespace="CELERY")
