#!/usr/bin/env bash
# The beat role: celery beat on django-celery-beat's database scheduler. It syncs
# the static schedules into beat's rows first (idempotent), so it never fires stale ones.
# Extra arguments go to `celery beat`. Runs from anywhere (deploy/python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/python.sh beat

export LUMASTRA_WORKER_MODE=disabled
"$PYTHON" manage.py sync_schedules
exec "$PYTHON" -m celery -A lumastra beat \
  -S django_celery_beat.schedulers:DatabaseScheduler --loglevel=INFO "$@"
