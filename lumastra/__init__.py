"""The project package: the configuration, Django's settings and URLs, and each role's entry
point. Importing it creates the Celery application (`celery_app`).

Configuration and wiring:
- `config`: the one typed view of the environment: every variable, its default, its parsing
- `settings`: Django settings, everything from `config`
- `logs`: every role's process log: readable lines, or JSON lines (LUMASTRA_LOG_FORMAT=json)
- `urls`: the URLs: the admin, the v1 API (with coverage's router), /metrics, the probes
- `celery`: the Celery application, configured from Django's settings
- `preflight`: checks Postgres and Valkey before the system starts, creates the database

The roles:
- `web`: `python -m lumastra.web`: uvicorn, with limits that keep slow clients from holding it
- `asgi`: the web role's application: Django behind the request body limits
- `csp`: a Content-Security-Policy on every HTML page the web role renders (middleware)
- `wsgi`: the WSGI application (`WSGI_APPLICATION`), for Django's tools; the web role is ASGI
- `workers`: `python -m lumastra.workers`: the worker role, a Celery worker per pool, supervised
- `flower`: `python -m lumastra.flower`: Flower, every path behind credentials and a known host

For webhook receivers:
- `webhooks`: `verify` checks a delivery's `X-Lumastra-Signature` (docs/webhooks.md)
"""

from lumastra.celery import app as celery_app

__all__ = ["celery_app"]
