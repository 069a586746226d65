"""`lumastra.preflight` names the programs registered tasks run that are not installed: for
`make run` and `make test`, and as the worker role starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lumastra.preflight import missing_commands


def test_a_missing_program_is_named_with_its_tasks_and_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: nothing is installed

    warnings = missing_commands()

    ffmpeg = next(w for w in warnings if w.startswith("ffmpeg is not installed: runs of "))
    assert "trickplay" in ffmpeg.partition("\n")[0]
    assert any("ffprobe" in w and "apt-get install ffmpeg" in w for w in warnings)


def test_the_worker_role_names_a_missing_program_as_it_starts(tmp_path: Path) -> None:
    # An empty PATH: the role starts (a warning is not a refusal) and says what is missing.
    environ = {**os.environ, "PATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "lumastra.preflight", "--role", "worker"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert "warning: ffmpeg is not installed" in done.stderr


def test_nothing_is_said_of_programs_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for program in ("ffmpeg", "ffprobe"):
        (tmp_path / program).write_text("#!/bin/sh\n")
        (tmp_path / program).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))

    assert missing_commands() == []
