"""Test categories that need something from the machine, and the rule for them: a skip is not
a pass.

A test marked `needs("browser")` (or "partitions", "media", "alerts") runs only where the machine
has what the category needs. Where it does not, the test **fails**, saying what is missing and how
to install it (`deploy/system-deps.sh test` installs it all, and `make test` runs it first),
unless the person running the tests opted out of that category by name:
`LUMASTRA_TEST_SKIP=browser,partitions`. Then the test is skipped, and the summary says which
categories were opted out and how many tests each skipped, so a green run never hides them.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

OPT_OUT = "LUMASTRA_TEST_SKIP"
_OPTED_OUT = f"opted out ({OPT_OUT})"


def _browser() -> str | None:
    chromium = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
    if os.access(chromium, os.X_OK):
        return None
    return f"Chromium is not at {chromium} (Debian's chromium, or point CHROMIUM_PATH at one)"


def _partitions() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing (Debian's iproute2, nftables, util-linux)"
    return None


def _media() -> str | None:
    missing = [tool for tool in ("ffmpeg", "ffprobe") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} missing (Debian's ffmpeg)" if missing else None


def _alerts() -> str | None:
    return None if shutil.which("promtool") else "promtool missing (Debian's prometheus)"


# Each category: why it cannot run on this machine, or None when it can.
CATEGORIES: dict[str, Callable[[], str | None]] = {
    "browser": _browser,
    "partitions": _partitions,
    "media": _media,
    "alerts": _alerts,
}


def opted_out() -> set[str]:
    return {name.strip() for name in os.environ.get(OPT_OUT, "").split(",") if name.strip()}


def missing(category: str) -> str | None:
    return CATEGORIES[category]()


def require(category: str) -> None:
    """Return when the machine can run the category's tests; else fail the test, or skip it
    if the category was opted out of."""
    reason = missing(category)
    if reason is None:
        return
    if category in opted_out():
        pytest.skip(f"{category} {_OPTED_OUT}: {reason}")
    pytest.fail(
        f"the {category} tests cannot run here: {reason}. `deploy/system-deps.sh test` installs "
        f"what they need (`make test` runs it), or opt out by name: {OPT_OUT}={category}",
        pytrace=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(category): the test needs what a category of tests/support/categories.py names",
    )
    unknown = opted_out() - CATEGORIES.keys()
    if unknown:
        raise pytest.UsageError(
            f"{OPT_OUT} names unknown categories {sorted(unknown)}; known: {sorted(CATEGORIES)}"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # First, so a missing category fails the test before its fixtures start servers for it.
    for mark in item.iter_markers("needs"):
        for category in mark.args:
            require(category)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # Read from the reports, not counted in `require`, so it holds under pytest-xdist too.
    skipped: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        category = reason.removeprefix("Skipped: ").split(" ", 1)[0]
        if category in CATEGORIES and _OPTED_OUT in reason:
            skipped[category] += 1
    if skipped:
        counts = ", ".join(f"{name} ({n} tests)" for name, n in sorted(skipped.items()))
        terminalreporter.write_line(f"NOT RUN, opted out by {OPT_OUT}: {counts}", yellow=True)
