"""`manage.py healthcheck [--ready] [--role web|worker|beat|flower]`: the container health checks.

Without options it only proves that the project loads and its settings are valid (exit 0).
`--ready` checks what `GET /readyz` checks (orchestrator.api.health): PostgreSQL, applied
migrations, the coordination Valkey and the broker. `--role` (implies `--ready`) also checks
that the role running beside it in this container does its work:

- `web`: its own `/readyz` answers 200 on 127.0.0.1 (LUMASTRA_WEB_PORT);
- `worker`: the roster (`cluster.roster`) holds, for this host, the loops process, a Celery
  worker for every pool this host should run and each of the role's restarted children
  (`settings.LUMASTRA_WORKER_CHILDREN`: the file watcher), each announced within the roster's
  TTL;
- `beat`: a `celery beat` process runs on this host;
- `flower`: Flower answers on 127.0.0.1 (`--flower-port`, 5555) and asks for credentials (401).

It prints one `name ok|fail` line per check and exits 1 when any failed, 0 otherwise.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from orchestrator.api import health
from orchestrator.cluster import roster

ROLES = ("web", "worker", "beat", "flower")


def _status(url: str) -> int | None:
    try:
        # Only the http://127.0.0.1 URLs built here: no scheme from outside.
        timeout = settings.CONFIG.health_timeout_s
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return None


def web_works() -> dict[str, bool]:
    return {"web": _status(f"http://127.0.0.1:{settings.CONFIG.web_port}/readyz") == 200}


def worker_works() -> dict[str, bool]:
    here = [node for node in roster.roster() if node.host == socket.gethostname()]
    serving = {pool for node in here if node.role == "worker" for pool in node.pools}
    found = {"loops": any(node.role == "loops" for node in here)}
    found.update(
        {
            child: any(node.role == child for node in here)
            for child in settings.LUMASTRA_WORKER_CHILDREN
        }
    )
    found.update({f"pool {pool}": pool in serving for pool in roster.host_pools()})
    return found


def beat_works() -> dict[str, bool]:
    def is_beat(cmdline: Path) -> bool:
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:  # the process ended while we looked
            return False
        return b"beat" in argv and any(part.endswith(b"celery") for part in argv)

    return {"beat": any(is_beat(path) for path in Path("/proc").glob("[0-9]*/cmdline"))}


def flower_works(port: int) -> dict[str, bool]:
    # Every Flower path asks for credentials: a 401 is Flower serving, and nothing else is.
    return {"flower": _status(f"http://127.0.0.1:{port}/") == 401}


class Command(BaseCommand):
    help = "Exit 0 when this process could serve (--ready: its stores; --role: its role too)."
    # A health check runs every few seconds: Django's system checks would only slow it down.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ready",
            action="store_true",
            help="also check PostgreSQL, migrations, the coordination Valkey and the broker",
        )
        parser.add_argument("--role", choices=ROLES, help="also check that this role works")
        parser.add_argument("--flower-port", type=int, default=5555)

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["ready"] and not options["role"]:
            self.stdout.write("ok")
            return
        statuses = health.readiness()
        checks = {name: status == "ok" for name, status in statuses.items()}
        role = options["role"]
        if role == "web":
            checks |= web_works()
        elif role == "worker" and health.is_ready(statuses):
            checks |= worker_works()
        elif role == "beat":
            checks |= beat_works()
        elif role == "flower":
            checks |= flower_works(options["flower_port"])
        for name, works in checks.items():
            self.stdout.write(f"{name} {'ok' if works else 'fail'}")
        if not all(checks.values()):
            raise SystemExit(1)
