"""`manage.py load_demo_catalog --items N [--seed S] [--replace] [--files] [--if-empty]`: a
realistic demo catalog (`--files`: with small real files below the first media root, for the
demo's covered stages to read: short videos and audio when ffmpeg is installed).

Series with seasons and episodes, movies, albums with tracks; some files missing, some items
without files (`coverage.catalog` says the mix). Loaded in one transaction, then ANALYZE.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from coverage import catalog
from coverage.models import MediaItem


class Command(BaseCommand):
    help = "Bulk-load a realistic demo media catalog (items, files, links, external ids)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--items", type=int, required=True, help="about how many items")
        parser.add_argument("--seed", type=int, default=0, help="the same seed, the same catalog")
        parser.add_argument(
            "--replace", action="store_true", help="empty the catalog first (it must be empty)"
        )
        parser.add_argument(
            "--files",
            action="store_true",
            help="write each present file, small, below the first media root's catalog/ folder",
        )
        parser.add_argument(
            "--if-empty", action="store_true", help="do nothing when the catalog has items"
        )

    def handle(
        self,
        *args: Any,
        items: int,
        seed: int,
        replace: bool,
        files: bool,
        if_empty: bool,
        **options: Any,
    ) -> None:
        if items < 1:
            raise CommandError("--items must be at least 1")
        if if_empty and not replace and MediaItem.objects.exists():
            self.stdout.write("the catalog has items already; left as it is")
            return
        began = time.monotonic()
        files_under = None
        if files:
            roots = settings.CONFIG.media_roots
            if not roots:
                raise CommandError("--files needs a media root (LUMASTRA_MEDIA_ROOTS is empty)")
            files_under = roots[0] / "catalog"
        if replace:
            catalog.clear()
        try:
            loaded = catalog.load(items, seed, files_under)
        except catalog.CatalogNotEmpty as exc:
            raise CommandError(f"{exc}; pass --replace to empty it first") from None
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(loaded.items.items()))
        self.stdout.write(
            f"loaded {loaded.total} items ({kinds}), {loaded.files} files "
            f"({loaded.missing} missing), {loaded.links} file links, "
            f"{loaded.external_ids} external ids, {loaded.rows} coverage rows "
            f"in {time.monotonic() - began:.1f} s"
        )
        if files and loaded.media:
            self.stdout.write(
                f"wrote short videos and audio with ffmpeg below {files_under}, "
                f"{loaded.corrupt} of them corrupt on purpose"
            )
        elif files:
            self.stderr.write(
                f"ffmpeg is not installed: the files below {files_under} are placeholder bytes, "
                "which the media stages (probe, trickplay) fail as unreadable. Install Debian's "
                "ffmpeg package (apt-get install ffmpeg) and load again with --replace."
            )
