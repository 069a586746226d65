"""`manage.py load_demo_catalog --items N [--seed S] [--replace]`: a realistic demo catalog.

Series with seasons and episodes, movies, albums with tracks; some files missing, some items
without files (`coverage.catalog` says the mix). Loaded in one transaction, then ANALYZE.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coverage import catalog


class Command(BaseCommand):
    help = "Bulk-load a realistic demo media catalog (items, files, links, external ids)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--items", type=int, required=True, help="about how many items")
        parser.add_argument("--seed", type=int, default=0, help="the same seed, the same catalog")
        parser.add_argument(
            "--replace", action="store_true", help="empty the catalog first (it must be empty)"
        )

    def handle(self, *args: Any, items: int, seed: int, replace: bool, **options: Any) -> None:
        if items < 1:
            raise CommandError("--items must be at least 1")
        began = time.monotonic()
        if replace:
            catalog.clear()
        try:
            loaded = catalog.load(items, seed)
        except catalog.CatalogNotEmpty as exc:
            raise CommandError(f"{exc}; pass --replace to empty it first") from None
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(loaded.items.items()))
        self.stdout.write(
            f"loaded {loaded.total} items ({kinds}), {loaded.files} files "
            f"({loaded.missing} missing), {loaded.links} file links, "
            f"{loaded.external_ids} external ids, {loaded.rows} coverage rows "
            f"in {time.monotonic() - began:.1f} s"
        )
