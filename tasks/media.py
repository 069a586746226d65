"""Media paths: how a task takes a folder from its input without reaching past the media roots.

A worker reads files with its process's rights, and a run's input is not trusted. A task that
reads files declares its path fields as `MediaPath` and reads through `open_folder`:

- At start, `MediaPath` resolves the path (symbolic links and `..` included) and refuses one
  that is relative or resolves outside the media roots (`LUMASTRA_MEDIA_ROOTS`): the API
  answers 422 and `start_run` raises `InvalidInput`. The input is stored resolved.
- In the worker the input is validated again at pickup (a path that escapes by then fails the
  run, kind `validation`), and `open_folder` opens the folder from its media root one
  component at a time, following no link: a folder replaced by a link, or a file replaced by
  one, fails the run with `MediaPathError`, a `PermanentError`.
- `MediaFolder.walk` never follows a link (links are counted and skipped), reads directories
  lazily, descends at most `max_depth` levels and stops at `limit` files or `max_entries`
  entries looked at, whichever comes first.

Not guarded: hard links and mounts that put other content under a root (the operator chooses
the roots), and files task code opens itself with `open()`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Annotated, BinaryIO

from django.conf import settings
from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from tasks.errors import PermanentError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in for a file must not hang the open.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class MediaPathError(PermanentError):
    """A path a task was asked to read escapes the media roots or cannot be opened safely."""


def media_roots() -> tuple[Path, ...]:
    """The configured media roots, resolved: an operator's root may itself be a link (to a
    mount, say), and is trusted to be one."""
    return tuple(Path(os.path.realpath(root)) for root in settings.CONFIG.media_roots)


def _root_of(path: Path) -> Path | None:
    """The innermost media root `path` lies in, by its configured or its resolved name."""
    candidates = {*settings.CONFIG.media_roots, *media_roots()}
    inside = [root for root in candidates if path.is_relative_to(root)]
    return max(inside, key=lambda root: len(root.parts), default=None)


def _confine(path: Path) -> Path:
    if not path.is_absolute():
        raise PydanticCustomError("media_path_relative", "must be an absolute path")
    try:
        resolved = Path(os.path.realpath(path))
    except (OSError, ValueError) as exc:
        raise PydanticCustomError(
            "media_path_unresolvable", "cannot be resolved: {reason}", {"reason": str(exc)}
        ) from None
    if _root_of(resolved) is None:
        # The resolved target is not echoed: the answer must not map links for the caller.
        roots = ", ".join(str(root) for root in settings.CONFIG.media_roots) or "none configured"
        raise PydanticCustomError(
            "outside_media_roots",
            "resolves outside the media roots ({roots})",
            {"roots": roots},
        )
    return resolved


MediaPath = Annotated[Path, AfterValidator(_confine)]
"""An absolute path that resolves inside a media root; validated into its resolved form."""


@dataclass
class WalkStats:
    visited: int = 0  # directory entries looked at
    skipped_links: int = 0  # symbolic links met and not followed
    too_deep: int = 0  # folders not entered because they lie below max_depth
    truncated: bool = False  # the walk stopped at a limit; the folder may hold more


class MediaFolder:
    """A folder below a media root, held open while a task walks and reads it. Close it (or
    use it as a context manager) when done."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.stats = WalkStats()
        self._fd = fd

    def __enter__(self) -> MediaFolder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def walk(self, *, limit: int, max_depth: int, max_entries: int) -> Iterator[PurePosixPath]:
        """The regular files below the folder, relative to it, in directory order. Files in
        the folder itself are at depth 0."""
        if limit < 1 or max_depth < 0 or max_entries < 1:
            raise ValueError("limit and max_entries must be >= 1, max_depth >= 0")
        found = 0
        with closing(self._walk(self._fd, PurePosixPath(), 0, max_depth, max_entries)) as files:
            for relative in files:
                yield relative
                found += 1
                if found >= limit:
                    self.stats.truncated = True
                    return

    def _walk(
        self, dir_fd: int, prefix: PurePosixPath, depth: int, max_depth: int, max_entries: int
    ) -> Generator[PurePosixPath, None, None]:
        # One directory descriptor and one listing held per level: depth bounds them.
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if self.stats.visited >= max_entries:
                    self.stats.truncated = True
                    return
                self.stats.visited += 1
                relative = prefix / entry.name
                if entry.is_symlink():
                    self.stats.skipped_links += 1
                elif entry.is_file(follow_symlinks=False):
                    yield relative
                elif entry.is_dir(follow_symlinks=False):
                    if depth >= max_depth:
                        self.stats.too_deep += 1
                        continue
                    child = _open_at(dir_fd, entry.name, _DIR_FLAGS, self.path / relative)
                    try:
                        yield from self._walk(child, relative, depth + 1, max_depth, max_entries)
                    finally:
                        os.close(child)

    def open(self, relative: PurePosixPath) -> BinaryIO:
        """A regular file below the folder, opened for reading without following a link."""
        parts = relative.parts
        if not parts or relative.is_absolute() or ".." in parts:
            raise MediaPathError(f"{relative} is not a path below {self.path}")
        fd = _open_below(self._fd, parts, _FILE_FLAGS, self.path / relative)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise MediaPathError(f"{self.path / relative} is not a regular file")
        return os.fdopen(fd, "rb")


def open_folder(path: Path) -> MediaFolder:
    """Open `path`, a folder below a media root, reaching it from the root without following
    a link; `MediaPathError` when it escapes, is missing or is not a folder."""
    if not path.is_absolute() or ".." in path.parts:
        raise MediaPathError(f"{path} is not an absolute path without '..'")
    root = _root_of(path)
    if root is None:
        raise MediaPathError(f"{path} is outside the media roots")
    try:
        # The root itself is the operator's and may be a link; nothing below it may.
        root_fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as exc:
        raise _refusal(Path(root), exc) from None
    parts = path.relative_to(root).parts
    if not parts:
        return MediaFolder(path, root_fd)
    try:
        return MediaFolder(path, _open_below(root_fd, parts, _DIR_FLAGS, path))
    finally:
        os.close(root_fd)


def _open_below(dir_fd: int, parts: tuple[str, ...], flags: int, shown: Path) -> int:
    """Open `parts` below `dir_fd` one component at a time, every one with O_NOFOLLOW."""
    current = dir_fd
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            opened = _open_at(current, part, flags if last else _DIR_FLAGS, shown)
            if current != dir_fd:
                os.close(current)
            current = opened
    except BaseException:
        if current != dir_fd:
            os.close(current)
        raise
    return current


def _open_at(dir_fd: int, name: str, flags: int, shown: Path) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(shown, exc, _is_link(dir_fd, name)) from None


def _is_link(dir_fd: int, name: str) -> bool:
    # Only for the message: with O_DIRECTORY a link is refused as ENOTDIR, not ELOOP.
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _refusal(shown: Path, exc: OSError, is_link: bool = False) -> MediaPathError:
    if is_link:
        return MediaPathError(f"{shown} is, or passes through, a symbolic link")
    reasons = {
        errno.ELOOP: "is, or passes through, a symbolic link",
        errno.ENOTDIR: "is not a folder",
        errno.ENOENT: "does not exist",
        errno.EACCES: "cannot be read (permission denied)",
    }
    reason = reasons.get(exc.errno or 0, f"cannot be opened ({exc.strerror})")
    return MediaPathError(f"{shown} {reason}")
