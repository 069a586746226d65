#!/usr/bin/env bash
# The worker role: one prefork Celery worker per pool, each with its pool's budget
# as concurrency (see lumastra/workers.py; `--print-plan` shows the pools), and the
# orchestrator loops. Extra arguments go to every `celery worker` (e.g. --loglevel=DEBUG).
# Runs from anywhere (deploy/python.sh). `exec`, so SIGTERM/SIGINT reach lumastra.workers
# itself: it stops taking messages, gives running runs LUMASTRA_SHUTDOWN_GRACE_S, hands the
# rest back (pending, for another worker), ends every process it started and exits 0 (idle,
# within a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/python.sh worker

export LUMASTRA_WORKER_MODE=enabled
exec "$PYTHON" -m lumastra.workers "$@"
