#!/usr/bin/env bash
# The Flower role: queues and workers, behind credentials on every path (lumastra/flower.py;
# FLOWER_BASIC_AUTH). Extra arguments go to Flower (e.g. --address=0.0.0.0 --port=5555).
# Runs from anywhere (deploy/python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/python.sh flower

exec "$PYTHON" -m lumastra.flower "$@"
