"""The catalog kept in step with the files of the media roots (issue 41): what the file watcher
(`coverage.watcher`), its reconcile scan and an operator's rescan write.

`sync(root, folder)` compares the files below `folder` (a folder of the media root `root`, or
the root itself) on disk with the catalog's, in one transaction:

- a file the catalog does not know becomes a `media_files` row with its item and their link: a
  video a movie (its title and year from the file's name, "Heat (1995).mkv"), an audio file a
  track of the album its folder names; other files are not media and are left out;
- a known file with another size or mtime is updated: the catalog's trigger says
  `file.modified`, and the stages that read files start again (through the outbox, as any
  catalog change);
- a known file no longer on disk is marked `is_missing` (`file.presence_changed`: the stages
  whose eligibility needs a present file dispose of its rows); one that came back is not.

The walk follows no symbolic link and reads only names and `stat`: unchanged files cost a stat
and a comparison, and nothing is written for them, so a scan of a whole root selects only what
changed. Paths are stored resolved and absolute, as the demo catalog's are. A file is marked
missing only when its path is really gone (`lstat`), never because the walk could not read its
folder or left it out. Syncs of one root take turns (an advisory lock), so the watcher and an
operator's rescan never insert one file twice.

Refused (`NotSynced`): a folder outside its root, hidden, or reached through a link; a root that
is gone, or empty while the catalog holds its files (a mount that failed: emptying the catalog
would reset every stage of the library). Left out and counted (`unstorable`): names that are
not UTF-8 and paths over PATH_MAX characters, which Postgres cannot store.

Not guaranteed: a folder moved within a root is its files gone and new files (new items, the
old items kept with missing files); a rewrite that keeps the size and the mtime is not seen.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from coverage.models import ItemKind, MediaFile, MediaFileItem, MediaItem
from orchestrator.runs.handle import RunHandle
from orchestrator.runs.start import start_run

VIDEO = frozenset({".mkv", ".mp4", ".m4v", ".avi", ".mov", ".webm", ".ts", ".wmv"})
AUDIO = frozenset({".mp3", ".flac", ".m4a", ".ogg", ".opus", ".wav", ".aac"})
_YEAR = re.compile(r"\s*[(\[](\d{4})[)\]]\s*$")
_TRACK_NUMBER = re.compile(r"^(\d{1,3})[\s._-]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# `media_files.path`'s length.
PATH_MAX = 1000
RESCAN_TASK = "catalog-rescan"
# An operator's rescan: before the sweep's work, after a player's.
RESCAN_PRIORITY = 2


class OutsideRoots(ValueError):
    pass


@dataclass
class Synced:
    added: int = 0
    modified: int = 0
    missing: int = 0
    back: int = 0  # marked missing before, on disk again
    unstorable: int = 0  # media files left out: a name not UTF-8, or a path too long

    @property
    def changes(self) -> int:
        return self.added + self.modified + self.missing + self.back


@dataclass(frozen=True)
class OnDisk:
    size: int
    mtime: datetime


@dataclass
class Walked:
    """What a walk found: the media files by path, the folders it could not read, and the
    names it left out because the catalog cannot hold them (not UTF-8, too long)."""

    files: dict[str, OnDisk] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    unstorable: int = 0

    def vouches_for(self, path: str) -> bool:
        """Whether the walk could have seen `path`: it is a media file's name, in no folder
        the walk could not read, and it really is gone (a file the walk left out is not)."""
        if not is_media(path) or any(path.startswith(f"{f}/") for f in self.unreadable):
            return False
        try:
            os.lstat(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False


class NotSynced(RuntimeError):
    """The folder is not one to sync: outside its root, hidden, reached through a link, or a
    root that is gone or empty while the catalog still holds its files (a mount that failed)."""


def is_media(path: str) -> bool:
    name = os.path.basename(path)
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in VIDEO | AUDIO


def sync(root: Path, folder: Path) -> Synced:
    """Bring the catalog's files below `folder` in step with the disk (see the module); raises
    NotSynced for a folder it must not touch."""
    _check(root, folder)
    prefix = f"{folder}/"
    walked = _walk(folder)
    below = MediaFile.objects.filter(path__startswith=prefix)
    if folder == root and not walked.files and not any(root.iterdir()) and below.exists():
        raise NotSynced(f"{root} is empty but the catalog holds its files: is it mounted?")
    synced = Synced()
    with transaction.atomic():
        # One sync of a root at a time (the watcher's and an operator's rescan): the second
        # reads what the first wrote.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"library:{root}"])
        known = {row.path: row for row in below.only("id", "path", "size", "mtime", "is_missing")}
        found = walked.files
        synced.added = _add(root, sorted(path for path in found if path not in known), found)
        changed, back, learnt = [], [], []
        for path, row in known.items():
            disk = found.get(path)
            if disk is None:
                continue
            if row.is_missing:
                back.append(row)
            elif row.mtime is None and row.size == disk.size:
                learnt.append(row)  # a row from before the scan kept mtimes: not a rewrite
            elif (row.size, row.mtime) != (disk.size, disk.mtime):
                changed.append(row)
            else:
                continue
            row.size, row.mtime, row.is_missing = disk.size, disk.mtime, False
        MediaFile.objects.bulk_update(
            changed + back + learnt, ["size", "mtime", "is_missing"], 1000
        )
        synced.modified, synced.back = len(changed), len(back)
        gone = [
            row.id
            for path, row in known.items()
            if path not in found and not row.is_missing and walked.vouches_for(path)
        ]
        synced.missing = MediaFile.objects.filter(id__in=gone).update(is_missing=True)
    synced.unstorable = walked.unstorable
    return synced


def _check(root: Path, folder: Path) -> None:
    if not folder.is_relative_to(root):
        raise NotSynced(f"{folder} is not inside the media root {root}")
    if any(part.startswith(".") for part in folder.relative_to(root).parts):
        raise NotSynced(f"{folder} is hidden")
    if os.path.lexists(folder) and folder.resolve() != folder:
        raise NotSynced(f"{folder} is reached through a symbolic link")
    if not root.is_dir():
        raise NotSynced(f"the media root {root} is gone: is it mounted?")


def _walk(folder: Path) -> Walked:
    """Every media file below `folder`, by path; no link followed, hidden names skipped."""
    walked = Walked()

    def unreadable(error: OSError) -> None:
        # A folder gone is a folder whose files are gone; one that cannot be read says nothing.
        if not isinstance(error, FileNotFoundError):
            walked.unreadable.append(error.filename)

    for top, folders, names in os.walk(folder, followlinks=False, onerror=unreadable):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in names:
            path = os.path.join(top, name)
            if not is_media(path):
                continue
            if len(path) > PATH_MAX or not _utf8(path):
                walked.unstorable += 1
                continue
            try:
                stat = os.lstat(path)
            except OSError:
                continue  # gone between the listing and the stat: the next sync sees it gone
            if not os.path.islink(path) and os.path.isfile(path):
                mtime = _EPOCH + timedelta(microseconds=stat.st_mtime_ns // 1000)
                walked.files[path] = OnDisk(stat.st_size, mtime)
    return walked


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False  # bytes that are not UTF-8, kept by Python as lone surrogates
    return "\x00" not in path


def _add(root: Path, paths: list[str], found: dict[str, OnDisk]) -> int:
    """Items, files and links for new media files, in a few bulk statements."""
    if not paths:
        return 0
    library = root.name or "media"
    albums: dict[str, MediaItem] = {}
    items: list[MediaItem] = []
    for path in paths:
        name = Path(path)
        if name.suffix.lower() in VIDEO:
            title, year = _titled(name.stem)
            items.append(MediaItem(kind=ItemKind.MOVIE, library=library, title=title, year=year))
            continue
        album = name.parent.name or library
        if album not in albums:
            albums[album] = MediaItem.objects.filter(
                kind=ItemKind.ALBUM, library=library, title=album
            ).first() or MediaItem.objects.create(kind=ItemKind.ALBUM, library=library, title=album)
        number = _TRACK_NUMBER.match(name.stem)
        items.append(
            MediaItem(
                kind=ItemKind.TRACK,
                parent=albums[album],
                library=library,
                title=_TRACK_NUMBER.sub("", name.stem) or name.stem,
                index_number=int(number.group(1)) if number else None,
            )
        )
    MediaItem.objects.bulk_create(items, batch_size=1000)
    files = MediaFile.objects.bulk_create(
        [MediaFile(path=path, size=found[path].size, mtime=found[path].mtime) for path in paths],
        batch_size=1000,
    )
    MediaFileItem.objects.bulk_create(
        [MediaFileItem(file=file, item=item) for file, item in zip(files, items, strict=True)],
        batch_size=1000,
    )
    return len(paths)


def _titled(stem: str) -> tuple[str, int | None]:
    """ "Heat (1995)" → ("Heat", 1995); dots and underscores read as spaces."""
    text = stem.replace(".", " ").replace("_", " ").strip()
    year = _YEAR.search(text)
    if year is None:
        return text or stem, None
    return text[: year.start()].strip() or text, int(year.group(1))


def within(roots: tuple[Path, ...], path: Path) -> Path | None:
    """The media root `path` is inside (both resolved), or None: a rescan goes nowhere else."""
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    for root in roots:
        try:
            if resolved.is_relative_to(root.resolve(strict=True)):
                return root.resolve()
        except (OSError, RuntimeError):
            continue
    return None


def start_rescan(path: str, trigger: dict[str, Any]) -> RunHandle:
    """An operator's "rescan now" of a folder (or a whole root): the catalog-rescan run that
    syncs it, at priority 2; asked again while it is queued or running, that same run.
    Raises OutsideRoots for a path that is not inside a media root."""
    root = within(settings.CONFIG.media_roots, Path(path))
    if root is None:
        raise OutsideRoots(f"{path!r} is not a folder inside a media root (LUMASTRA_MEDIA_ROOTS)")
    folder = str(Path(path).resolve())
    return start_run(
        RESCAN_TASK,
        {"path": folder},
        trigger=trigger,
        priority=RESCAN_PRIORITY,
        idempotency_key=f"{RESCAN_TASK}:{folder}",
    )
