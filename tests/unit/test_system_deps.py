"""deploy/system-deps.sh, where it cannot install: one line per missing Debian package, naming
the command that installs it, and a failing exit before anything else runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.fixtures import ROOT

SCRIPT = ROOT / "deploy" / "system-deps.sh"


def _run(tmp_path: Path, purpose: str, **env: str) -> subprocess.CompletedProcess[str]:
    # A PATH with the shell's basics and no apt-get, ffmpeg or ffprobe: as on a machine that
    # cannot install them.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("bash", "id"):
        target = bin_dir / tool
        if not target.exists():
            target.symlink_to(shutil.which(tool) or tool)
    return subprocess.run(
        ["bash", str(SCRIPT), purpose],
        env={"PATH": str(bin_dir), "CHROMIUM_PATH": str(tmp_path / "no-chromium"), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_what_cannot_be_installed_is_named_one_line_each_with_its_command(tmp_path: Path) -> None:
    done = _run(tmp_path, "test")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    for package in ("ffmpeg", "chromium"):
        line = f"sudo apt-get install -y --no-install-recommends {package}"
        assert sum(line in each for each in lines) == 1, done.stderr
    assert "LUMASTRA_TEST_SKIP=" in done.stderr


def test_an_opted_out_category_needs_nothing(tmp_path: Path) -> None:
    done = _run(tmp_path, "test", LUMASTRA_TEST_SKIP="browser,media,partitions,alerts")
    assert (done.returncode, done.stderr) == (0, "")


def test_make_run_needs_only_ffmpeg(tmp_path: Path) -> None:
    done = _run(tmp_path, "run")
    assert done.returncode == 1
    assert "'ffmpeg'" in done.stderr and "chromium" not in done.stderr


def test_the_makefile_and_ci_use_it_and_ci_installs_nothing_itself() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "deploy/system-deps.sh run" in makefile and "deploy/system-deps.sh test" in makefile
    assert "apt-get" not in (ROOT / ".ci" / "run").read_text()
    assert os.access(SCRIPT, os.X_OK)
