#!/usr/bin/env bash
# The worker role (DESIGN §2): one prefork Celery worker per pool, each with its pool's budget
# as concurrency (see lumastra/workers.py; `--print-plan` shows the pools), and the
# orchestrator loops. Extra arguments go to every `celery worker` (e.g. --loglevel=DEBUG).
# Runs from anywhere (deploy/python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/python.sh

export WORKER_MODE=enabled
exec "$PYTHON" -m lumastra.workers "$@"
