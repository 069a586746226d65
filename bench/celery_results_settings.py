"""Django settings of the Celery + django-celery-results peer (bench/celery_results_app.py).

A settings module of its own, so the peer never touches the project's database: Postgres is
PEER_RESULTS_DATABASE_URL, the broker PEER_RESULTS_BROKER_URL (bench/peers.py sets both). The
setup is the one the django-celery-results docs describe, plus what a Django worker needs to
be fair: persistent connections (`CONN_MAX_AGE = None`, with health checks), because Celery's
Django fix-up otherwise opens a new connection for every task.

Delivery is bare Celery's (bench/bare_app.py): Lumastra's settings, passed in
BENCH_DELIVERY_SETTINGS, except that results are kept, which is the point of this peer.
"""

from __future__ import annotations

import json
import os

import dj_database_url

SECRET_KEY = "bench-celery-results-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_results"]
DATABASES = {
    "default": {
        **dj_database_url.parse(os.environ["PEER_RESULTS_DATABASE_URL"]),
        "CONN_MAX_AGE": None,
        "CONN_HEALTH_CHECKS": True,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

QUEUE = "bench.results"
TASK_NAME = "bench-results-noop"

CELERY_BROKER_URL = os.environ["PEER_RESULTS_BROKER_URL"]
CELERY_RESULT_BACKEND = "django-db"
CELERY_TASK_DEFAULT_QUEUE = QUEUE
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "priority_steps": [1, 2, 3, 5, 7],
    "queue_order_strategy": "round_robin",
    "visibility_timeout": 3600,
}
CELERY_TASK_DEFAULT_PRIORITY = 5
for _key, _value in json.loads(os.environ.get("BENCH_DELIVERY_SETTINGS", "{}")).items():
    globals()[f"CELERY_{_key.upper()}"] = _value
# Whatever Lumastra does with results, this peer stores every one in Postgres.
CELERY_TASK_IGNORE_RESULT = False
