"""No module of the engine, the SDK, the catalog or the project package is over 450 lines
(issue 24): past that a file holds more than one job, and a newcomer reads it in two sittings.
Django's migrations are generated and left out."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("lumastra", "orchestrator", "tasks", "coverage")
MOST_LINES = 450


def _modules() -> list[Path]:
    return sorted(
        path
        for name in ROOTS
        for path in (ROOT / name).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
    )


def test_the_walk_finds_the_tree() -> None:
    # Guards the walk: a moved root must not make the check below vacuous.
    assert len(_modules()) > 150


def test_no_module_is_over_450_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules()
        if (n := len(path.read_text().splitlines())) > MOST_LINES
    }
    assert not long, f"split these by concern: {long}"
