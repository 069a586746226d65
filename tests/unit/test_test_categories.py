"""A category of tests the machine cannot run fails the run, unless opted out of by name, and
then the summary says so (tests/support/categories.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.fixtures import ROOT

OPTS = ("-p", "no:cacheprovider", "-rs")
TEST = """
import pytest

@pytest.mark.needs("browser")
def test_in_a_browser():
    pass

def test_plain():
    pass
"""


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_needs.py"
    test.write_text(TEST)
    environ = {k: v for k, v in os.environ.items() if k != "LUMASTRA_TEST_SKIP"}
    return subprocess.run(
        # -c /dev/null: only the plugin under test, none of the project's configuration.
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            "/dev/null",
            "-p",
            "tests.support.categories",
            *OPTS,
            str(test),
        ],
        cwd=ROOT,
        env={**environ, "PYTHONPATH": str(ROOT), "CHROMIUM_PATH": str(tmp_path / "none"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_category_the_machine_lacks_fails_naming_what_and_how(tmp_path: Path) -> None:
    done = _pytest(tmp_path)
    assert done.returncode == 1, done.stdout
    # Failed in its setup, before any fixture: pytest counts it as an error.
    assert "1 passed" in done.stdout and "1 error" in done.stdout
    assert f"Chromium is not at {tmp_path / 'none'}" in done.stdout
    assert "LUMASTRA_TEST_SKIP=browser" in done.stdout
    assert "NOT RUN" not in done.stdout


def test_an_opted_out_category_is_skipped_and_the_summary_says_so(tmp_path: Path) -> None:
    done = _pytest(tmp_path, LUMASTRA_TEST_SKIP="partitions, browser")
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout.replace(", 1 warning", "")
    assert "NOT RUN, opted out by LUMASTRA_TEST_SKIP: browser (1 tests)" in done.stdout


def test_an_unknown_category_is_refused(tmp_path: Path) -> None:
    done = _pytest(tmp_path, LUMASTRA_TEST_SKIP="browsers")
    assert done.returncode == 4
    assert "LUMASTRA_TEST_SKIP names unknown categories ['browsers']" in done.stderr
