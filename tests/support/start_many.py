"""Run `start_run` many times from a separate process, as another replica would.

Usage: python -m tests.support.start_many <task> <json-input> <count> <start-at-epoch-s>
       [idempotency-key]. Prints one JSON line per start: [run_id, deduplicated].
"""

from __future__ import annotations

import json
import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
django.setup()

from orchestrator.runs.start import start_run  # noqa: E402
from orchestrator.triggers import TriggerKind  # noqa: E402


def main() -> None:
    task, raw_input, count, start_at = sys.argv[1:5]
    key = sys.argv[5] if len(sys.argv) > 5 else None
    # Every process begins at the same moment, so their starts really race.
    time.sleep(max(0.0, float(start_at) - time.time()))
    for index in range(int(count)):
        data = json.loads(raw_input.replace("{i}", str(index)))
        handle = start_run(task, data, trigger=TriggerKind.API, idempotency_key=key)
        print(json.dumps([handle.run_id, handle.deduplicated]), flush=True)


if __name__ == "__main__":
    main()
