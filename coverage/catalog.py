"""A realistic demo catalog, generated and bulk-loaded (`manage.py load_demo_catalog`).

The mix: about 30 % of the items are movies, 45 % television (series of 1 to 6 seasons of 6 to
13 episodes), 25 % music (albums of 8 to 14 tracks). Most movies, episodes and tracks have one file;
some have none (not yet found on disk), some files are missing (gone since they were found),
most present files are probed with a content hash. Movies, series, episodes and albums carry
external ids at the usual providers, some of them not. The same seed gives the same catalog.
Every covered stage gets its rows for the new items in the same call (no outbox events).

With `files_under`, each present file is written there, small and real: short videos and audio
rendered by ffmpeg (`coverage.samples`), a few of them corrupt on purpose, left unprobed for
the demo's `probe` stage. Without ffmpeg, files of placeholder bytes stand in (and say so).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pgtrigger
from django.db import connection, transaction

from coverage import counts, samples
from coverage.models import ExternalId, ItemKind, MediaFile, MediaFileItem, MediaItem
from coverage.sweep import seed_all

TABLES = ("media_items", "media_files", "media_file_items", "external_ids")
BATCH = 5_000

_WORDS = (  # noqa: SIM905 (a phrase reads better than 37 quoted words)
    "silent river night golden shadow last empire broken glass winter garden city "
    "lost northern light storm harbour paper moon iron crown distant signal hidden "
    "road wild echo summer stone blue hour velvet machine open sea quiet fire"
).split()

# Share of each kind of leaf item that has a file, and of files that are missing from disk.
HAS_FILE = {ItemKind.MOVIE: 0.92, ItemKind.EPISODE: 0.90, ItemKind.TRACK: 0.95}
MISSING = 0.04
PROBED = 0.70
# (provider, share of the kind's items that have an id there)
EXTERNAL = {
    ItemKind.MOVIE: (("tmdb", 0.85), ("imdb", 0.60)),
    ItemKind.SERIES: (("tvdb", 0.90),),
    ItemKind.EPISODE: (("tvdb", 0.50),),
    ItemKind.ALBUM: (("musicbrainz", 0.80),),
}
SIZE_MB = {ItemKind.MOVIE: (700, 8_000), ItemKind.EPISODE: (200, 2_000), ItemKind.TRACK: (3, 15)}


@dataclass
class Loaded:
    items: Counter[str] = field(default_factory=Counter)
    files: int = 0
    missing: int = 0
    links: int = 0
    external_ids: int = 0
    rows: int = 0  # coverage rows made for the covered stages
    corrupt: int = 0  # files written corrupt on purpose (with real media only)
    media: bool = False  # the files written are real media (ffmpeg was found)

    @property
    def total(self) -> int:
        return sum(self.items.values())


class CatalogNotEmpty(Exception):
    pass


# The catalog triggers a bulk load skips: its items get their coverage rows in one pass
# (`coverage.sweep.seed_all`) instead of one outbox event each.
BULK_IGNORED_TRIGGERS = (
    "coverage.MediaItem:items_created",
    "coverage.MediaFileItem:links_created",
    "coverage.ExternalId:external_ids_created",
)


def clear() -> None:
    """Empty the catalog, its coverage rows and its outbox; the sweep's walks start over."""
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)}, event_outbox RESTART IDENTITY CASCADE")
        cursor.execute("UPDATE coverage_stage SET seeded_through = 0, heal_cursor = 0")


def load(items: int, seed: int = 0, files_under: Path | None = None) -> Loaded:
    """Add a catalog of about `items` items (never more) in one transaction, then ANALYZE.
    With `files_under`, each present file is written there, small, so tasks can read it."""
    if MediaItem.objects.exists():
        raise CatalogNotEmpty(f"the catalog already has {MediaItem.objects.count()} items")
    rng = random.Random(seed)
    loaded = Loaded()
    with (
        samples.rendered() if files_under is not None else nullcontext(None) as clips,
        transaction.atomic(),
        pgtrigger.ignore(*BULK_IGNORED_TRIGGERS),
    ):
        _Builder(rng, loaded, files_under, clips).build(items)
    loaded.media = clips is not None
    with connection.cursor() as cursor:
        # Fresh statistics, or the planner guesses badly right after a bulk load.
        for table in TABLES:
            cursor.execute(f"ANALYZE {table}")
    loaded.rows = sum(seed_all().values())
    # The rows' own triggers kept the counts; recounted anyway, since a bulk path is where
    # they would drift (a trigger turned off), and folded in for the first read.
    counts.recount()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE media_item_stage_state")
    return loaded


class _Builder:
    def __init__(
        self,
        rng: random.Random,
        loaded: Loaded,
        files_under: Path | None,
        clips: samples.Samples | None,
    ) -> None:
        self.rng = rng
        self.loaded = loaded
        self.files_under = files_under
        self.clips = clips
        self.now = datetime.now(UTC)

    def title(self, words: int = 3) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(words)).title()

    def build(self, items: int) -> None:
        tv_budget, music_budget = int(items * 0.45), int(items * 0.25)
        series, seasons, episodes = self.television(tv_budget)
        albums, tracks = self.music(music_budget)
        movies = [
            MediaItem(kind=ItemKind.MOVIE, library="Movies", title=self.title(), year=self.year())
            for _ in range(
                items - len(series) - len(seasons) - len(episodes) - len(albums) - len(tracks)
            )
        ]
        # Parents before children: each level's ids come back from its insert, and Django takes
        # a child's parent id from its (now saved) parent object.
        self.insert(movies + series + albums)
        self.insert(seasons)
        self.insert(episodes + tracks)
        self.files_and_ids(movies + series + albums + episodes + tracks)

    def year(self) -> int:
        return self.rng.randint(1950, 2026)

    def television(self, budget: int) -> tuple[list[MediaItem], ...]:
        series: list[MediaItem] = []
        seasons: list[MediaItem] = []
        episodes: list[MediaItem] = []
        while True:
            counts = [self.rng.randint(6, 13) for _ in range(self.rng.randint(1, 6))]
            if len(series) + len(seasons) + len(episodes) + 1 + len(counts) + sum(counts) > budget:
                return series, seasons, episodes
            show = MediaItem(
                kind=ItemKind.SERIES, library="TV", title=self.title(), year=self.year()
            )
            series.append(show)
            for season, count in zip(
                self.children(show, ItemKind.SEASON, len(counts), lambda n: f"Season {n}"),
                counts,
                strict=True,
            ):
                seasons.append(season)
                episodes += self.children(season, ItemKind.EPISODE, count)

    def music(self, budget: int) -> tuple[list[MediaItem], list[MediaItem]]:
        albums: list[MediaItem] = []
        tracks: list[MediaItem] = []
        while True:
            count = self.rng.randint(8, 14)
            if len(albums) + len(tracks) + 1 + count > budget:
                return albums, tracks
            album = MediaItem(
                kind=ItemKind.ALBUM, library="Music", title=self.title(), year=self.year()
            )
            albums.append(album)
            tracks += self.children(album, ItemKind.TRACK, count)

    def children(
        self,
        parent: MediaItem,
        kind: ItemKind,
        count: int,
        title: Callable[[int], str] | None = None,
    ) -> list[MediaItem]:
        """`count` items numbered from 1 under `parent`, titled by `title(number)` or at random."""
        return [
            MediaItem(
                kind=kind,
                library=parent.library,
                title=title(number) if title else self.title(2),
                parent=parent,
                index_number=number,
            )
            for number in range(1, count + 1)
        ]

    def insert(self, items: list[MediaItem]) -> None:
        MediaItem.objects.bulk_create(items, batch_size=BATCH)
        self.loaded.items.update(item.kind for item in items)

    def files_and_ids(self, items: list[MediaItem]) -> None:
        files: list[MediaFile] = []
        owners: list[MediaItem] = []
        ids: list[ExternalId] = []
        for item in items:
            kind = ItemKind(item.kind)
            if kind in HAS_FILE and self.rng.random() < HAS_FILE[kind]:
                files.append(self.file(item, kind))
                owners.append(item)
            for provider, share in EXTERNAL.get(kind, ()):
                if self.rng.random() < share:
                    ids.append(ExternalId(item=item, provider=provider, value=self.id_at(provider)))
        MediaFile.objects.bulk_create(files, batch_size=BATCH)
        links = [MediaFileItem(file=f, item=i) for f, i in zip(files, owners, strict=True)]
        MediaFileItem.objects.bulk_create(links, batch_size=BATCH)
        ExternalId.objects.bulk_create(ids, batch_size=BATCH)
        self.loaded.files = len(files)
        self.loaded.missing = sum(f.is_missing for f in files)
        self.loaded.links = len(links)
        self.loaded.external_ids = len(ids)

    def file(self, item: MediaItem, kind: ItemKind) -> MediaFile:
        low, high = SIZE_MB[kind]
        extension = "flac" if kind is ItemKind.TRACK else "mkv"
        name = f"{item.pk:08d} {item.title}.{extension}"
        missing = self.rng.random() < MISSING
        probed = not missing and self.rng.random() < PROBED
        size = self.rng.randint(low, high) * 1_000_000
        if self.files_under is None:
            path = f"/media/{item.library}/{name}"
        else:
            # A small real file stands for the big one (it is gone when the item's is missing).
            target = self.files_under / item.library / name
            path = str(target)
            size = self.rng.randint(4, 64) * 1024 if missing else self.write(target, kind)
            # Real media is left for the probe stage to probe.
            probed = probed and self.clips is None
        return MediaFile(
            path=path,
            size=size,
            is_missing=missing,
            probed_at=self.now - timedelta(days=self.rng.randint(0, 400)) if probed else None,
            content_hash=hashlib.sha256(path.encode()).hexdigest() if probed else "",
        )

    def write(self, target: Path, kind: ItemKind) -> int:
        """Write one present file; its size."""
        target.parent.mkdir(parents=True, exist_ok=True)
        if self.clips is None:
            size = self.rng.randint(4, 64) * 1024
            target.write_bytes(hashlib.sha256(str(target).encode()).digest() * (size // 32))
            return size
        corrupt = self.rng.random() < samples.CORRUPT
        self.loaded.corrupt += corrupt
        return self.clips.write(target, audio=kind is ItemKind.TRACK, corrupt=corrupt, rng=self.rng)

    def id_at(self, provider: str) -> str:
        number = self.rng.randint(1, 9_999_999)
        return f"tt{number:07d}" if provider == "imdb" else str(number)
