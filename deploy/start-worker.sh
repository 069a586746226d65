#!/usr/bin/env bash
# The worker role (DESIGN §2): one prefork Celery worker per pool, each with its pool's budget
# as concurrency (see lumastra/workers.py; `--print-plan` shows the pools). Extra arguments go
# to every `celery worker` (e.g. --loglevel=DEBUG).
set -euo pipefail
cd "$(dirname "$0")/.."

export WORKER_MODE=enabled
exec python -m lumastra.workers "$@"
