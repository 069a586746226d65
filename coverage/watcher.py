"""The file watcher (issue 41): `python -m coverage.watcher`, a child of the worker role
(`lumastra.workers` restarts it with backoff when it dies), turning changes of the media roots'
files into catalog changes (`coverage.library.sync`); the catalog's triggers and the outbox
then reset what the changes touch, and the stage-sweep does the work.

- **One watcher per root across the cluster.** Each root is a seat (a `LoopLock`, `watch:<root
  digest>`); a watcher watches the roots whose seats it holds and looks for free ones every
  SEAT_RENEW_S. Its token is its host's and its worker role's, so a watcher restarted after a
  crash takes its seats back at once instead of waiting for their leases.
- **Events** come from watchfiles (Rust `notify`: inotify on Linux). Each changed path notes
  its folder; a folder is synced once no event came for LUMASTRA_WATCH_DELAY_S (or it has been
  waiting ten times that, under a stream of writes), with its parent folders' pending syncs
  covering it: a burst of files becomes one sync.
- **The reconcile scan** syncs each held root whole when the watcher takes its seat (what
  changed while nobody watched: a crash, a restart, a host down) and every
  LUMASTRA_WATCH_RESCAN_S after (file systems without events: network mounts). Unchanged
  files cost a `stat` and write nothing.
- **Seen.** It announces itself in the node roster (role `watcher`, the roots it watches, on
  the Cluster page); the worker role's health check fails while it is missing, and its death
  is an operator's notification (`watcher_down`, written by the role).

A sync that fails (Postgres away) is tried again after RETRY_S, and so is a reconcile; a folder
the library refuses (hidden, a link) is left alone. The seats and the roster entry are renewed
by their own thread every HEARTBEAT_S, so a reconcile of a large root keeps both; each sync
checks its root's seat first, and a seat lost stops the watching to take again what is held.
SIGTERM stops it after the sync in progress.

Not guaranteed: an event the kernel drops (inotify's queue overflowing under a storm) is found
by the next reconcile scan, up to LUMASTRA_WATCH_RESCAN_S later.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import django

if TYPE_CHECKING:
    from watchfiles import Change

log = logging.getLogger("coverage.watcher")

SEAT_LEASE = timedelta(seconds=30)
SEAT_RENEW_S = 10.0
# How often watchfiles hands back control when nothing happens: flushes and seats.
TICK_MS = 1000
# A folder written to without pause is synced anyway once it has waited this many delays.
MAX_WAIT_DELAYS = 10
# A failed sync or reconcile is tried again after this long.
RETRY_S = 60.0
# The seats and the roster entry are renewed this often by their own thread, so a long sync
# (the first reconcile of a large root) loses neither.
HEARTBEAT_S = 5.0
ROLE = "watcher"
STOP_TIMEOUT_S = 30.0
# The variable the worker role names itself by, for the watcher's seat token.
SUPERVISOR = "LUMASTRA_WORKER_ROLE_PID"


@dataclass
class Pending:
    """Folders with changes not yet synced, and when each was first and last touched."""

    delay_s: float
    first: dict[Path, float] = field(default_factory=dict)
    last: dict[Path, float] = field(default_factory=dict)

    def note(self, folder: Path, now: float) -> None:
        self.first.setdefault(folder, now)
        self.last[folder] = now

    def due(self, now: float) -> list[Path]:
        """The folders to sync now (and no longer pending): quiet for the delay, or waiting too
        long; a folder whose ancestor is due goes with it."""
        longest = self.delay_s * MAX_WAIT_DELAYS
        ready = {
            folder
            for folder, last in self.last.items()
            if now - last >= self.delay_s or now - self.first[folder] >= longest
        }
        for folder in ready:
            del self.first[folder], self.last[folder]
        return sorted(f for f in ready if not any(a in ready for a in f.parents))


@dataclass
class Watcher:
    """What one process watches, and its syncs: `sync` is `coverage.library.sync`, `guard`
    raises LockLost unless the root's seat is still this process's."""

    roots: list[Path]
    sync: Callable[[Path, Path], object]
    guard: Callable[[Path], None]
    pending: Pending

    def root_of(self, path: Path) -> Path | None:
        return next((root for root in self.roots if path.is_relative_to(root)), None)

    def note(self, paths: Iterable[str], now: float) -> None:
        for changed in paths:
            folder = Path(changed).parent
            root = self.root_of(folder)
            # Hidden folders (a trash, a download's partial folder) are not the library's.
            if root is not None and not any(
                p.startswith(".") for p in folder.relative_to(root).parts
            ):
                self.pending.note(folder, now)

    def flush(self, now: float) -> None:
        from coverage.library import NotSynced

        for folder in self.pending.due(now):
            root = self.root_of(folder)
            if root is None:
                continue
            self.guard(root)
            try:
                changes = self.sync(root, folder)
            except NotSynced as exc:
                log.info("watcher: %s not synced: %s", folder, exc)
                continue
            except Exception:
                log.exception("watcher: sync of %s failed; tried again at the next flush", folder)
                self.pending.note(folder, now - self.pending.delay_s + RETRY_S)
                continue
            log.info("watcher: synced %s: %s", folder, changes)

    def reconcile(self) -> bool:
        """Each root synced whole; False when one failed (tried again in RETRY_S)."""
        whole = True
        for root in self.roots:
            self.guard(root)
            started = time.monotonic()
            try:
                changes = self.sync(root, root)
            except Exception:
                log.exception("watcher: reconcile of %s failed; tried again in %ss", root, RETRY_S)
                whole = False
                continue
            took = time.monotonic() - started
            log.info("watcher: reconciled %s in %.2fs: %s", root, took, changes)
        return whole


def seat_name(root: Path) -> str:
    return "watch:" + hashlib.sha256(str(root).encode()).hexdigest()[:16]


def _media(change: Change, path: str) -> bool:
    # Any name but a hidden one: a folder's name may hold a dot ("The.Matrix.1999"), and its
    # move is a change of everything below it; the sync reads only media files.
    return not os.path.basename(path).startswith(".")


def run(stop: threading.Event) -> None:
    """Watch until `stop`: take seats, reconcile, follow events (see the module)."""
    from django.conf import settings

    from coverage import library
    from orchestrator.cluster import roster
    from orchestrator.cluster.locks import LockLost, LoopLock

    config, cover = settings.CONFIG, settings.COVERAGE
    roots = [root.resolve() for root in config.media_roots if root.is_dir()]
    token = f"{socket.gethostname()}:{os.environ.get(SUPERVISOR, os.getpid())}"
    seats = {root: LoopLock(seat_name(root), SEAT_LEASE, token) for root in roots}
    node = roster.this_node(ROLE, [])
    held: list[Path] = []

    def holding() -> list[Path]:
        return [root for root, seat in seats.items() if seat.hold()]

    def heartbeat() -> None:
        # Its own thread: a sync that takes minutes keeps the seats and the roster entry.
        while not stop.wait(HEARTBEAT_S):
            try:
                for root in list(held):
                    seats[root].renew()
                roster.announce(replace(node, watching=tuple(map(str, held))))
            except Exception:
                log.exception("watcher: heartbeat failed; the next one tries again")

    threading.Thread(target=heartbeat, name="watcher-heartbeat", daemon=True).start()
    try:
        while not stop.is_set():
            held[:] = holding()
            roster.announce(replace(node, watching=tuple(map(str, held))))
            if not held:
                stop.wait(SEAT_RENEW_S)
                continue
            watcher = Watcher(
                list(held),
                library.sync,
                lambda root: seats[root].check(),
                Pending(cover.watch_delay_s),
            )
            # The first reconcile waits for the first answer of watchfiles, which comes once its
            # watches are in place: a file written before then is found by the scan, one after
            # by its event (or both: a sync is idempotent).
            rescan_at = 0.0
            seats_at = time.monotonic() + SEAT_RENEW_S
            log.info("watcher: watching %s", ", ".join(map(str, held)))
            try:
                for changes in _events(list(held), stop):
                    now = time.monotonic()
                    watcher.note((path for _, path in changes), now)
                    watcher.flush(now)
                    if now >= rescan_at:
                        whole = watcher.reconcile()
                        rescan_at = now + (cover.watch_rescan_s if whole else RETRY_S)
                    if now >= seats_at:
                        seats_at = now + SEAT_RENEW_S
                        if holding() != held:
                            break  # a seat lost or one free: watch again what is held now
                else:
                    watcher.flush(float("inf"))  # stopping: what is pending is synced first
            except LockLost as exc:
                log.warning("watcher: %s; watching again what this process holds", exc)
    finally:
        for seat in seats.values():
            seat.release()


def _events(roots: list[Path], stop: threading.Event) -> Iterable[set[tuple[Change, str]]]:
    import watchfiles

    return watchfiles.watch(
        *roots,
        watch_filter=_media,
        stop_event=stop,
        rust_timeout=TICK_MS,
        yield_on_timeout=True,
        ignore_permission_denied=True,
        raise_interrupt=False,
    )


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    stop = threading.Event()
    # The handler only notes the signal and the main thread sets `stop`: a handler that set it
    # could run inside `stop.wait` on the same lock (`orchestrator.loops` says how that hung).
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watching = threading.Thread(target=run, args=(stop,), name="watcher", daemon=True)
    watching.start()
    while not received and watching.is_alive():
        time.sleep(0.1)
    stop.set()
    watching.join(timeout=STOP_TIMEOUT_S)
    log.info("watcher: stopped")
    return 0 if received else 1


if __name__ == "__main__":
    sys.exit(main())
