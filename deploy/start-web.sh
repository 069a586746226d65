#!/usr/bin/env bash
# The web role (DESIGN §2): Django over ASGI — API, admin and operator pages. It may start
# runs but consumes nothing: no Celery worker, no orchestrator loop.
#   LUMASTRA_WEB_HOST (default 127.0.0.1), LUMASTRA_WEB_PORT (default 8000); extra arguments
#   go to uvicorn (e.g. --workers 4).
set -euo pipefail
cd "$(dirname "$0")/.."

export WORKER_MODE=disabled
# Django's advice for ASGI: persistent connections are not reused across requests there (each
# request runs its sync code in a fresh thread), so they would only pile up.
export LUMASTRA_DB_CONN_MAX_AGE_S="${LUMASTRA_DB_CONN_MAX_AGE_S:-0}"

# Django's ASGI handler has no lifespan protocol; "off" spares a warning at every start.
exec python -m uvicorn lumastra.asgi:application \
  --host "${LUMASTRA_WEB_HOST:-127.0.0.1}" \
  --port "${LUMASTRA_WEB_PORT:-8000}" \
  --lifespan off \
  "$@"
