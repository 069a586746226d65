#!/usr/bin/env bash
# The web role: Django over ASGI — API, admin and operator pages. It may start
# runs but consumes nothing: no Celery worker, no orchestrator loop.
# lumastra/web.py runs uvicorn with the address (LUMASTRA_WEB_HOST, LUMASTRA_WEB_PORT) and the
# connection limits (LUMASTRA_WEB_*, docs/security.md) from the environment; extra arguments
# go to uvicorn after those (e.g. --workers 4). Runs from anywhere (deploy/python.sh). `exec`,
# so SIGTERM/SIGINT reach uvicorn itself: it finishes the requests in flight and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/python.sh web

export LUMASTRA_WORKER_MODE=disabled
# Django's advice for ASGI: persistent connections are not reused across requests there (each
# request runs its sync code in a fresh thread), so they would only pile up.
export LUMASTRA_DB_CONN_MAX_AGE_S="${LUMASTRA_DB_CONN_MAX_AGE_S:-0}"

exec "$PYTHON" -m lumastra.web "$@"
