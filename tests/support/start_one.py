"""One start_run in a process of its own: `python -m tests.support.start_one TASK KEY`.

Sets Django up on the environment it is given, says `ready` once its Valkey client has a
connection, waits for a line on stdin, then starts one run of TASK with input {"key": KEY}
outside any transaction (as the API does) and prints what came of it as JSON: the run id, or
the error start_run raised. The test around it decides what the stores do meanwhile.
"""

from __future__ import annotations

import json
import os
import sys

import django


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    from orchestrator.runs.start import start_run
    from orchestrator.stores import valkey
    from orchestrator.triggers import TriggerKind

    valkey.client().ping()
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        handle = start_run(sys.argv[1], {"key": sys.argv[2]}, trigger=TriggerKind.MANUAL)
    except Exception as exc:
        print(json.dumps({"error": repr(exc)}), flush=True)
        return 1
    print(json.dumps({"run_id": handle.run_id}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
