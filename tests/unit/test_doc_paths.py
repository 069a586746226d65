"""Every file the docs and the code's own docs name by its path exists (issue 24): a module
that moved takes its references with it, or this test names each one left behind.

Checked: paths with a file suffix under the project's folders (`orchestrator/runs/drain.py`,
`deploy/start-web.sh`; a static file as the `static` tag names it, `orchestrator/console.js`),
in every Markdown page and every source file. Dotted names are not checked: permission
codenames, model labels and Celery task names share their form with module names.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("orchestrator", "lumastra", "tasks", "coverage", "bench", "deploy", "tests", "docs")
SEARCHED = (*FOLDERS, "templates")
SOURCES = {".py", ".lua", ".sql", ".sh", ".md", ".html", ".yml", ".js", ".css"}
_SUFFIX = r"\.(?:py|lua|sql|sh|md|yml|toml|html|js|css|json|conf)\b"
_FILE = re.compile(rf"(?<![\w./-])((?:{'|'.join(FOLDERS)})/[\w./-]*{_SUFFIX})")


def _files() -> list[Path]:
    found = sorted(ROOT.glob("*.md"))
    for folder in SEARCHED:
        found += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in SOURCES)
    return [p for p in found if p.is_file() and p != Path(__file__)]


def _missing(line: str) -> list[str]:
    return [
        reference
        for reference in _FILE.findall(line)
        if not (ROOT / reference).exists()
        # A static file is named by its path under an app's `static/` folder.
        and not any((static / reference).exists() for static in ROOT.glob("*/static"))
    ]


def test_every_file_named_by_its_path_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{number}: {reference}"
        for path in _files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        # Paths a test makes up for its own files.
        if "example" not in line
        for reference in _missing(line)
    ]

    assert missing == [], "\n".join(missing)


def test_the_check_finds_a_path_that_moved_and_passes_one_that_exists() -> None:
    line = "(orchestrator/circuit.py), `orchestrator/hooks/circuit.py`, orchestrator/console.js"

    assert _missing(line) == ["orchestrator/circuit.py"]
