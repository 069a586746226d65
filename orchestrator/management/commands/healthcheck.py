"""`manage.py healthcheck [--ready]`: the web role's probes for roles without HTTP.

The worker, beat and flower containers run it as their health check (deploy/docker-compose.yml).
Without `--ready` it only proves that the project loads and its settings are valid (exit 0);
with `--ready` it checks what `GET /readyz` checks (orchestrator.api.health): PostgreSQL,
applied migrations, the coordination Valkey and the broker. It prints one `name ok|fail` line
per dependency and exits 1 when any failed, 0 otherwise.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from orchestrator.api import health


class Command(BaseCommand):
    help = "Exit 0 when this process could serve (with --ready: every dependency reachable)."
    # A health check runs every few seconds: Django's system checks would only slow it down.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ready",
            action="store_true",
            help="also check PostgreSQL, migrations, the coordination Valkey and the broker",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["ready"]:
            self.stdout.write("ok")
            return
        statuses = health.readiness()
        for name, status in statuses.items():
            self.stdout.write(f"{name} {status}")
        if not health.is_ready(statuses):
            raise SystemExit(1)
