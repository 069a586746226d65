"""One owner of a run's end (issue 37): only `orchestrator/runs/terminal.py` makes the
statements that end a run and settles what they wrote.

The tree is read, not imported: any module of the engine, the catalog, the project or the SDK
that calls one of the writer's ending statements (`durable.end`, `end_cancelled`,
`end_orphan`, `fail_pending`), imports them by name, or calls `settle` fails here, naming its
file and line. The one exception: `recovery/repair.py` settles an end Postgres already holds
(a live hash left behind), which ends nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("orchestrator", "coverage", "lumastra", "tasks")
OWNER = ROOT / "orchestrator" / "runs" / "terminal.py"
ENDING = {"end", "end_cancelled", "end_orphan", "fail_pending"}
SETTLES = {OWNER, ROOT / "orchestrator" / "recovery" / "repair.py"}


def _findings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.stores.durable":
            for alias in node.names:
                if alias.name in ENDING:
                    yield f"{where}:{node.lineno} imports durable.{alias.name}"
        settle_imported = (
            isinstance(node, ast.ImportFrom)
            and node.module == "orchestrator.runs.terminal"
            and any(alias.name == "settle" for alias in node.names)
        )
        if settle_imported and path not in SETTLES:
            yield f"{where}:{node.lineno} imports settle"
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ENDING
            and isinstance(func.value, ast.Name)
            and func.value.id == "durable"
        ):
            yield f"{where}:{node.lineno} calls durable.{func.attr}"
        if isinstance(func, ast.Name | ast.Attribute) and path not in SETTLES:
            name = func.id if isinstance(func, ast.Name) else func.attr
            if name == "settle":
                yield f"{where}:{node.lineno} calls settle"


def _scanned() -> list[Path]:
    return [
        path
        for top in SCANNED
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != OWNER and "migrations" not in path.parts
    ]


def test_the_scan_sees_the_owner_and_would_catch_a_second_one() -> None:
    # Guards the scan itself: the owner makes every ending call, so scanning it must find them.
    found = " ".join(_findings(OWNER))
    assert all(f"durable.{name}" in found for name in ENDING)


def test_nothing_but_terminal_ends_a_run() -> None:
    findings = [finding for path in _scanned() for finding in _findings(path)]
    assert findings == []
