"""`manage.py coverage_seed`: give every item its row in every covered stage now.

The sweep gives rows to a few items per tick (LUMASTRA_COVERAGE_SEED_PER_TICK) and new items
get theirs from the outbox; a stage added over an existing catalog is filled at once here.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand

from coverage.sweep import seed_all


class Command(BaseCommand):
    help = "Make the missing coverage rows of every covered stage, in batches."

    def handle(self, *args: Any, **options: Any) -> None:
        began = time.monotonic()
        made = seed_all()
        for stage, count in made.items():
            self.stdout.write(f"{stage}: {count} rows made")
        self.stdout.write(f"done in {time.monotonic() - began:.1f} s")
