"""Django settings: everything comes from `lumastra.config`, which reads the environment."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url

from coverage import config as coverage_config
from lumastra import config
from lumastra.logs import logging_config
from orchestrator.stores import keys

CONFIG = config.current()
COVERAGE = coverage_config.current()  # the catalog's own settings (coverage/config.py)
BASE_DIR = Path(__file__).resolve().parent.parent

# The role scripts refuse to start without LUMASTRA_SECRET_KEY (deploy/python.sh; `make run`
# sets the demo's). Tools on a development machine (manage.py, mypy's Django plugin) fall back
# to a key named so that `check --deploy` flags it (security.W009).
DEVELOPMENT_SECRET_KEY = "django-insecure-lumastra-development-only"  # noqa: S105 (on purpose)
SECRET_KEY = CONFIG.secret_key or DEVELOPMENT_SECRET_KEY
DEBUG = CONFIG.debug
ALLOWED_HOSTS = list(CONFIG.allowed_hosts)
CSRF_TRUSTED_ORIGINS = list(CONFIG.csrf_trusted_origins)

# Production (docs/operations.md): behind HTTPS, cookies never travel in clear and plain HTTP
# is redirected. Off by default, since `make run` serves plain HTTP on 127.0.0.1. The probes
# (/healthz, /readyz) are answered before the redirect (orchestrator.api.health).
SESSION_COOKIE_SECURE = CONFIG.https
CSRF_COOKIE_SECURE = CONFIG.https
SECURE_SSL_REDIRECT = CONFIG.https
if CONFIG.proxy_ssl_header:
    # Only behind a proxy that sets this header itself and drops a client's.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = CONFIG.hsts_seconds
SECURE_HSTS_INCLUDE_SUBDOMAINS = CONFIG.hsts_include_subdomains
SECURE_HSTS_PRELOAD = CONFIG.hsts_preload

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_celery_beat",
    # Its templates and static files: the API docs load Swagger UI from here, not a CDN.
    "ninja",
    "pgtrigger",
    "tasks",
    "orchestrator",
    "coverage",
]

MIDDLEWARE = [
    # First: /healthz and /readyz answer probes that use the container's address as Host.
    "orchestrator.api.health.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "orchestrator.api.limits.BodySizeLimitMiddleware",
    "orchestrator.api.text_guard.StorableTextMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "lumastra.csp.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "lumastra.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
ASGI_APPLICATION = "lumastra.asgi.application"
WSGI_APPLICATION = "lumastra.wsgi.application"

# Persistent connections with health checks: Celery's Django fix-up would otherwise open a
# new connection per task; the health check recovers from a dropped one.
DATABASES = {
    "default": dj_database_url.parse(
        CONFIG.database_url,
        conn_max_age=CONFIG.db_conn_max_age_s,
        conn_health_checks=True,
    )
}
# A connection whose path went dead (a partition: nothing answers, nothing says so) fails
# within LUMASTRA_STORE_TIMEOUT_S instead of hanging its thread for the kernel's 15-minute
# retransmission limit: a heartbeat, a claim or a terminal write must fail well inside the
# run's lease (`orchestrator.runs.watch`). Sent data unacknowledged that long fails the call
# (tcp_user_timeout); an idle or waiting connection is probed by keepalives. A slow query on a
# live server is not cut: its server's kernel still answers the probes.
DATABASES["default"]["OPTIONS"] = {
    "connect_timeout": CONFIG.store_timeout_s,
    "keepalives": 1,
    "keepalives_idle": max(1, CONFIG.store_timeout_s // 2),
    "keepalives_interval": 1,
    "keepalives_count": max(1, CONFIG.store_timeout_s // 2),
    "tcp_user_timeout": CONFIG.store_timeout_s * 1000,
    **DATABASES["default"].get("OPTIONS", {}),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The API body limit. Under ASGI, orchestrator.api.limits.BodyLimit refuses a bigger body
# before Django reads it (a JSON 413 on the API); it holds every other path (the admin) to
# this same number, far above what the admin's forms send.
DATA_UPLOAD_MAX_MEMORY_SIZE = CONFIG.api_max_body_bytes

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# Hashed names and gzip copies written by collectstatic (at image build, by `make run`, and once
# per test session when the sources changed: tests.support.fixtures), served by WhiteNoise
# with a year's max-age, since a changed file gets a new name.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

LOGGING = logging_config(CONFIG.log_format)

# Celery (namespace CELERY_): the broker, and delivery that acknowledges a message only after
# its run, so a lost worker's message is delivered again.
CELERY_BROKER_URL = CONFIG.celery_broker_url
if urlsplit(CELERY_BROKER_URL).scheme in ("redis", "rediss"):
    # kombu's Redis transport minus a new client per command (orchestrator.stores.broker).
    CELERY_BROKER_TRANSPORT = "orchestrator.stores.broker:Transport"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Recycled children: a leak or a one-off huge run cannot keep a process bloated forever.
# Off by default (0): a child Celery recycles by count exits with the next message already
# handed to it, and that message waits for the pool's maintenance tick, up to 5 s (issue 22's
# "slow rounds": docs/benchmarks.md). Children are still recycled by memory.
CELERY_WORKER_MAX_TASKS_PER_CHILD = CONFIG.worker_max_tasks_per_child or None
CELERY_WORKER_MAX_MEMORY_PER_CHILD = CONFIG.worker_max_memory_per_child_kb
# Every task checks and ages its database connections itself, without a round trip
# (`runner.check_connections`): Celery's Django fix-up would walk them twice more per task,
# and does so only once in this many tasks.
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# kombu's Redis transport puts each priority in its own sub-queue; the steps must contain our
# values 1|2|3|5|7 so none is rounded into another. A message published without a priority
# gets 5 (scheduled work): the default priority covers `apply_async`, the catch-all route
# covers `send_task`, which ignores the default.
# A worker's BRPOP lists every (queue, step) priority-major, so a lower number goes first
# across all of a pool's queues whatever the queue order. Within one step the first listed
# queue wins: `round_robin` moves the queue just served to the back, so tasks sharing a pool
# take turns; "priority" (the spine's choice, which priorities never needed) kept the order
# fixed and one task's backlog starved its pool-mates (issue 14, test_fair_pools.py).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "priority_steps": list(keys.BROKER_PRIORITY_STEPS),
    "sep": keys.BROKER_PRIORITY_SEPARATOR,
    "queue_order_strategy": "round_robin",
    "visibility_timeout": CONFIG.broker_visibility_timeout_s,
}
CELERY_TASK_DEFAULT_PRIORITY = 5
CELERY_TASK_ROUTES = {"*": {"priority": 5}}

# Loops of the apps above the engine, run by the worker role's loops process
# (`orchestrator.loops`): dotted paths to `factory(cluster_seat) -> list[Loop]`.
LUMASTRA_LOOP_FACTORIES = ["coverage.loops.loops"]

# Children of the worker role beside its pools and loops, restarted with backoff when they die
# (`lumastra.workers`) and required by its health check: name → the module run with -m.
LUMASTRA_WORKER_CHILDREN = {"watcher": "coverage.watcher"} if COVERAGE.watch else {}

# Prometheus collectors of the apps above the engine, added to /metrics at each scrape.
LUMASTRA_METRICS_COLLECTORS = ["coverage.metrics.BacklogCollector"]

# Dead-letter sections of the apps above the engine, on the admin's Dead letters page
# (`orchestrator.admin.dead_letters`): dotted paths to `source(limit) -> Section`.
LUMASTRA_DEAD_LETTER_SOURCES = ["coverage.dead_letters.outbox_section"]
