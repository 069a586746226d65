"""Short real media for the demo catalog's files (`load_demo_catalog --files`), so the demo's
`probe` and `trickplay` stages run ffmpeg on something real.

A handful of clips is rendered once per load from ffmpeg's own test sources (a test pattern
with a tone for videos, a tone for tracks; 2 to 10 s, tens of kilobytes) and each file is a
copy of one of them. A few copies are corrupt on purpose, two ways: unreadable throughout (no
tool can open them: the probe fails `permanent`), or damaged after a sound header (the probe
reads them, the trickplay's decode fails `permanent`). Without ffmpeg on PATH nothing is
rendered and the catalog writes placeholder bytes instead (`load_demo_catalog` says so).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FFMPEG = "ffmpeg"
CORRUPT = 0.04  # share of the present files written corrupt
# (test pattern, seconds) of each video clip; each audio clip is a tone of (hertz, seconds).
VIDEOS = (
    ("testsrc", 2),
    ("testsrc2", 4),
    ("smptebars", 6),
    ("rgbtestsrc", 8),
    ("smptehdbars", 10),
    ("yuvtestsrc", 5),
)
TONES = ((220, 3), (330, 5), (440, 7), (550, 9))
VIDEO_SIZE = "320x180"
VIDEO_FPS = 10
STRIPE = 997  # bytes between two damaged spots of a damaged clip


class Samples:
    def __init__(self, videos: list[Path], tones: list[Path]) -> None:
        self.videos = videos
        self.tones = tones

    def write(self, target: Path, *, audio: bool, corrupt: bool, rng: random.Random) -> int:
        """Write a copy of one clip to `target` (corrupt, if asked); its size in bytes."""
        data = rng.choice(self.tones if audio else self.videos).read_bytes()
        if corrupt and rng.random() < 0.5:
            data = rng.randbytes(len(data))  # unreadable throughout
        elif corrupt:
            data = _damaged(data)
        target.write_bytes(data)
        return len(data)


def _damaged(data: bytes) -> bytes:
    """A few bytes flipped every STRIPE past the first quarter: the header and the container
    still read, the frames do not decode (measured: 24 of 24 clips fail `ffmpeg -xerror`, a
    single damaged region only two in three, as the demuxer skips what it cannot parse)."""
    damaged = bytearray(data)
    for start in range(len(data) // 4, len(data), STRIPE):
        for at in range(start, min(start + 8, len(data))):
            damaged[at] ^= 0x5A
    return bytes(damaged)


def _render(ffmpeg: str, target: Path, *sources: str, codecs: tuple[str, ...]) -> Path:
    inputs = [part for source in sources for part in ("-f", "lavfi", "-i", source)]
    # Our own fixed arguments, no shell.
    subprocess.run(  # noqa: S603
        [ffmpeg, "-nostdin", "-v", "error", "-y", *inputs, *codecs, "-shortest", str(target)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return target


@contextmanager
def rendered() -> Iterator[Samples | None]:
    """The clips, rendered into a folder of their own that is removed afterwards; None when
    ffmpeg is not installed."""
    ffmpeg = shutil.which(FFMPEG)
    if ffmpeg is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="lumastra-samples-") as name:
        folder = Path(name)
        videos = [
            _render(
                ffmpeg,
                folder / f"{pattern}.mkv",
                f"{pattern}=duration={seconds}:size={VIDEO_SIZE}:rate={VIDEO_FPS}",
                f"sine=frequency={110 * (index + 2)}:duration={seconds}:sample_rate=8000",
                codecs=("-c:v", "mpeg4", "-q:v", "8", "-c:a", "flac"),
            )
            for index, (pattern, seconds) in enumerate(VIDEOS)
        ]
        tones = [
            _render(
                ffmpeg,
                folder / f"tone-{hertz}.flac",
                f"sine=frequency={hertz}:duration={seconds}:sample_rate=22050",
                codecs=("-c:a", "flac"),
            )
            for hertz, seconds in TONES
        ]
        yield Samples(videos, tones)
