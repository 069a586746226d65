"""A worker role of one pool for the fault battery: `python -m tests.faults.role HOSTNAME
CONCURRENCY QUEUES`.

The role's own supervisor (`lumastra.workers.Supervisor`: on SIGTERM the grace, the hand back
of the runs still running, and no process left behind) around one prefork `celery worker` on
the battery's queues, so a scenario restarts workers the way a deploy does without starting
every pool of the registry.
"""

from __future__ import annotations

import os
import sys

import django


def main(argv: list[str]) -> int:
    hostname, concurrency, queues = argv
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    from django.conf import settings

    from lumastra.workers import Supervisor, become_subreaper, worker_argv

    extra = ["--without-mingle", "--without-gossip", "--loglevel=INFO"]
    commands = {"pool": worker_argv(hostname, int(concurrency), queues.split(","), extra)}
    become_subreaper()
    return Supervisor(commands, grace_s=settings.CONFIG.shutdown_grace_s).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
