"""The file watcher (issue 41) on real files: `python -m coverage.watcher` alone turns copied,
rewritten and deleted files into catalog changes and a burst into one sync; under a real worker
role, copied files get their coverage done by the role's own sweep and pools, a rewritten one
is done again, a deleted one's row disposed, and a watcher SIGKILLed is restarted within 5 s,
catching up on what changed while it was down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from coverage.models import EventOutbox, MediaFile, MediaItemStageState
from orchestrator.cluster import roster
from orchestrator.models import Notification
from orchestrator.stores import keys, valkey
from tests.support.fixtures import ROOT, database_url, wait_for
from tests.support.processes import ONE_PROCESS_PER_POOL, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

DELAY_S = "1"


@pytest.fixture
def media(tmp_path: Path) -> Path:
    root = (tmp_path / "films").resolve()
    root.mkdir()
    return root


def _env(media: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "LUMASTRA_MEDIA_ROOTS": str(media),
        "LUMASTRA_WATCH_DELAY_S": DELAY_S,
        "LUMASTRA_SECRET_KEY": os.environ.get("LUMASTRA_SECRET_KEY", "test-" + "x" * 50),
        **extra,
    }


@contextmanager
def _running(argv: list[str], env: dict[str, str], name: str) -> Iterator[Path]:
    log = ROOT / f".pytest_cache/{name}-{os.getpid()}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield log
        finally:
            stop(process, timeout=30)


def _said(log: Path, words: str) -> int:
    return log.read_text(errors="replace").count(words)


def _files(media: Path, missing: bool | None = None) -> int:
    found = MediaFile.objects.filter(path__startswith=f"{media}/")
    return (found if missing is None else found.filter(is_missing=missing)).count()


def test_copies_rewrites_deletions_and_a_burst_become_catalog_changes(media: Path) -> None:
    argv = [sys.executable, "-m", "coverage.watcher"]
    with _running(argv, _env(media), "watcher") as log:
        wait_for(lambda: _said(log, "watcher: watching"), timeout=30)
        for n in range(50):
            (media / f"Film {n} (2001).mkv").write_bytes(b"x" * (n + 1))
        wait_for(lambda: _files(media) == 50, timeout=30)

        rewritten = media / "Film 7 (2001).mkv"
        rewritten.write_bytes(b"a longer content")
        (media / "Film 8 (2001).mkv").unlink()
        wait_for(lambda: _files(media, missing=True) == 1, timeout=30)
        wait_for(lambda: EventOutbox.objects.filter(kind="file.modified").exists(), timeout=30)
        assert MediaFile.objects.get(path=str(rewritten)).size == 16

        syncs = _said(log, "watcher: synced")
        burst = media / "burst"
        burst.mkdir()
        deadline = time.monotonic() + 2
        for n in range(500):  # 500 files over about two seconds
            (burst / f"Clip {n}.mkv").write_bytes(b"c")
            time.sleep(max(0.0, (deadline - time.monotonic()) / (500 - n)))
        wait_for(lambda: _files(media) == 550, timeout=30)
        time.sleep(float(DELAY_S) * 2)
        assert _said(log, "watcher: synced") == syncs + 1, log.read_text()


def test_under_the_worker_role_coverage_is_done_and_a_killed_watcher_catches_up(
    media: Path,
) -> None:
    env = _env(
        media,
        **ONE_PROCESS_PER_POOL,
        LUMASTRA_COVERAGE_SWEEP_INTERVAL_S="1",
        LUMASTRA_COVERAGE_DISPATCH_INTERVAL_S="1",
        LUMASTRA_COVERAGE_AUTHORITATIVE_STAGES="checksum",
    )
    valkey.client().delete(keys.orchestrator_lock("cluster"))
    argv = [sys.executable, "-m", "lumastra.workers", "--without-mingle", "--without-gossip"]
    with _running(argv, env, "watcher-role") as log:
        wait_for(lambda: _watcher_pid(media) is not None, timeout=90)
        for n in range(50):
            (media / f"Film {n} (2002).mkv").write_bytes(f"film {n}".encode())
        wait_for(lambda: _done("checksum", media) == 50, timeout=120, interval=0.5)

        # Rewritten: its checksum is done again, by a new run. Deleted: missing, and never
        # started again (its work stays done; no run is started for a file that is not there).
        rewritten = _row("checksum", media / "Film 1 (2002).mkv")
        deleted = _row("checksum", media / "Film 2 (2002).mkv")
        (media / "Film 1 (2002).mkv").write_bytes(b"a new cut of film 1")
        (media / "Film 2 (2002).mkv").unlink()
        wait_for(
            lambda: (
                _row("checksum", media / "Film 1 (2002).mkv").run_id != rewritten.run_id
                and _row("checksum", media / "Film 1 (2002).mkv").status == "completed"
            ),
            timeout=60,
            interval=0.5,
        )
        assert MediaFile.objects.get(path=str(media / "Film 2 (2002).mkv")).is_missing
        assert _row("checksum", media / "Film 2 (2002).mkv").run_id == deleted.run_id

        killed = _watcher_pid(media)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        died = time.monotonic()
        # While it is down: a new file, and a file gone.
        (media / "Late (2003).mkv").write_bytes(b"late")
        (media / "Film 0 (2002).mkv").unlink()
        wait_for(lambda: _watcher_pid(media) not in (None, killed), timeout=5)
        assert time.monotonic() - died < 5
        wait_for(lambda: _files(media) == 51 and _files(media, missing=True) == 2, timeout=30)
        wait_for(lambda: _done("checksum", media) == 49, timeout=60, interval=0.5)
        assert _said(log, "watcher died with -9; restarting it in 1s") == 1
        assert Notification.objects.filter(kind="watcher_down").count() == 1


def _watcher_pid(media: Path) -> int | None:
    """The pid of the watcher that announced it watches `media`, if one is alive."""
    for node in roster.roster():
        if node.role == "watcher" and str(media) in node.watching:
            try:
                os.kill(node.pid, 0)
            except ProcessLookupError:
                continue
            return node.pid
    return None


def _row(stage: str, path: Path) -> MediaItemStageState:
    return MediaItemStageState.objects.get(stage=stage, item__file_links__file__path=str(path))


def _done(stage: str, media: Path) -> int:
    """Items of `media`'s present files whose `stage` row completed."""
    return MediaItemStageState.objects.filter(
        stage=stage,
        status="completed",
        item__file_links__file__path__startswith=f"{media}/",
        item__file_links__file__is_missing=False,
    ).count()
