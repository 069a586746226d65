"""What the file watcher handles: files per second, the delay from a file's rewrite to its
coverage row's reset, and its CPU while idle.

    .venv/bin/python bench/watcher.py [-n 10000] [--folders 100] [--rewrites 1000] [--delay 1]

A real `python -m coverage.watcher` (LUMASTRA_WATCH_DELAY_S=--delay) watches a fresh media root
on the bench's database:
1. N files are copied in, over `--folders` folders, as fast as Python writes them: the rate is
   N over the time from the first write to the last file's catalog row (events noted,
   debounced, each folder synced);
2. every item's `checksum` row is marked completed, then `--rewrites` files are rewritten one
   by one: each one's delay is from its write to its `checksum` row's reset to pending (the
   watcher's debounce and sync, the catalog's trigger, the outbox dispatcher, which this script
   ticks every 0.1 s as the leader's loop would at that interval); the debounce is most of it
   by design;
3. the watcher's CPU over 30 s with nothing happening (its `utime + stime` in /proc).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

# Run as a script, so the project root is not on the path by itself.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.throughput import (  # noqa: E402
    BENCH_ENV,
    ROOT,
    fresh_redis,
    fresh_tables,
    load_average,
    percentile,
    setup,
    wait_until,
)

IDLE_S = 30.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--files", type=int, default=10_000)
    parser.add_argument("--folders", type=int, default=100)
    parser.add_argument("--rewrites", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=1.0, help="LUMASTRA_WATCH_DELAY_S")
    args = parser.parse_args(argv)
    # The demo catalog's stages, `checksum` among them, instead of the bench's no-op tasks.
    BENCH_ENV["LUMASTRA_TASK_MODULES"] = "tasks.definitions.catalog"
    setup()
    fresh_tables()
    fresh_redis()
    from coverage.stages import covered, sync

    sync(covered())
    with tempfile.TemporaryDirectory(prefix="lumastra-watch-") as tmp:
        root = Path(tmp).resolve() / "media"
        root.mkdir()
        watcher = _start(root, args.delay)
        try:
            print(f"N={args.files} files in {args.folders} folders, delay {args.delay:g} s "
                  f"(load {load_average()})")  # fmt: skip
            rate = _copy(root, args.files, args.folders)
            print(f"copied in: {rate:.0f} files/s from the first write to the last catalog row")
            delays = _rewrites(root, args.rewrites)
            print(
                f"rewrite -> coverage row reset over {len(delays)} files: "
                f"p50 {percentile(delays, 0.5):.2f} s, p99 {percentile(delays, 0.99):.2f} s "
                f"(the debounce, {args.delay:g} s, included)"
            )
            print(f"idle: {_idle_cpu(watcher.pid) * 100:.2f} % of a core over {IDLE_S:.0f} s")
        finally:
            watcher.terminate()
            watcher.wait(timeout=30)
    return 0


def _start(root: Path, delay_s: float) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **BENCH_ENV,
        "LUMASTRA_MEDIA_ROOTS": str(root),
        "LUMASTRA_WATCH_DELAY_S": str(delay_s),
        "LUMASTRA_WORKER_MODE": "enabled",
        "LUMASTRA_LOG_LEVEL": "WARNING",
    }
    watcher = subprocess.Popen([sys.executable, "-m", "coverage.watcher"], cwd=ROOT, env=env)
    from orchestrator.cluster import roster

    wait_until(
        lambda: any(n.role == "watcher" and n.watching for n in roster.roster()),
        timeout=60,
        what="the watcher to take its seat",
    )
    time.sleep(2)  # its first answer: watches in place, the first reconcile done
    return watcher


def _copy(root: Path, files: int, folders: int) -> float:
    from coverage.models import MediaFile

    started = time.monotonic()
    for n in range(files):
        folder = root / f"folder {n % folders:03d}"
        folder.mkdir(exist_ok=True)
        (folder / f"Film {n} (2001).mkv").write_bytes(b"x" * 64)
    wait_until(
        lambda: MediaFile.objects.filter(path__startswith=f"{root}/").count() == files,
        timeout=600,
        what="every file in the catalog",
        interval=0.2,
    )
    return files / (time.monotonic() - started)


def _rewrites(root: Path, count: int) -> list[float]:
    from coverage.dispatcher import Dispatcher
    from coverage.models import MediaFile, MediaItemStageState

    stop = threading.Event()

    def dispatch() -> None:
        from django.db import connection

        dispatcher = Dispatcher()
        while not stop.is_set():
            dispatcher.tick()
            stop.wait(0.1)
        connection.close()

    dispatching = threading.Thread(target=dispatch, daemon=True)
    dispatching.start()
    # Rows for every item (the dispatcher makes them from file.linked), then all completed.
    files = list(
        MediaFile.objects.filter(path__startswith=f"{root}/").values_list("path", "links__item_id")
    )
    wait_until(
        lambda: MediaItemStageState.objects.filter(stage="checksum").count() >= len(files),
        timeout=600,
        what="the checksum rows",
        interval=0.5,
    )
    MediaItemStageState.objects.filter(stage="checksum").update(status="completed")
    chosen = random.sample(files, count)
    written: dict[int, datetime] = {}
    for path, item_id in chosen:
        Path(path).write_bytes(b"rewritten" * 8)
        written[item_id] = datetime.now(UTC)
        time.sleep(0.005)
    wait_until(
        lambda: (
            MediaItemStageState.objects.filter(
                stage="checksum", item_id__in=written, status="pending"
            ).count()
            == len(written)
        ),
        timeout=600,
        what="every rewritten file's row reset",
        interval=0.2,
    )
    stop.set()
    dispatching.join(timeout=10)
    reset = MediaItemStageState.objects.filter(stage="checksum", item_id__in=written)
    return [
        (updated - written[item_id]).total_seconds()
        for item_id, updated in reset.values_list("item_id", "updated_at")
    ]


def _idle_cpu(pid: int) -> float:
    def ticks() -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    before, started = ticks(), time.monotonic()
    time.sleep(IDLE_S)
    return (ticks() - before) / TICKS_PER_S / (time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
