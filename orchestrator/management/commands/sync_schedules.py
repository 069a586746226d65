"""`manage.py sync_schedules`: static schedules → django-celery-beat rows (idempotent).

Run by `make run` before the roles start and by the beat role before beat starts
(deploy/Procfile). See `orchestrator.scheduler.sync` for what wins when an operator edited a
synced row. A bad `env_override` value exits non-zero naming the variable.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from orchestrator.scheduler.sync import ScheduleConfigError, sync


class Command(BaseCommand):
    help = "Sync the static schedules of the task definitions into celery beat's rows."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = sync()
        except ScheduleConfigError as exc:
            raise CommandError(f"bad schedule override: {exc}") from None
        self.stdout.write(f"schedules: {report.summary()}")
        for label, names in (
            ("created", report.created),
            ("updated", report.updated),
            ("enabled again", report.enabled_again),
            ("disabled (definition gone)", report.disabled),
        ):
            for name in names:
                self.stdout.write(f"  {label:27} {name}")
