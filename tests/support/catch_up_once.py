"""A replica booting: `python -m tests.support.catch_up_once <start-at-epoch>`.

Sets Django up, waits until the given wall-clock moment (so several processes boot at the
same instant), runs the scheduler's boot catch-up once and prints the tasks it fired.
"""

from __future__ import annotations

import json
import os
import sys
import time

import django


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    from orchestrator.scheduler.catchup import catch_up

    start_at = float(sys.argv[1])
    time.sleep(max(0.0, start_at - time.time()))
    report = catch_up()
    print(json.dumps({"fired": report.fired, "elsewhere": report.elsewhere}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
