"""One writer of run state (issue 22): only `orchestrator/stores/durable.py` and its `sql/` write
`task_history` rows.

An import-linter contract cannot see SQL, so this test reads the tree: every Python and SQL
file of the engine, the catalog, the project and the SDK (migrations aside) is scanned for the
ways a module could change a run's state or stages behind the writer's back:
- SQL text (in a `.sql` file or a Python string) that updates or inserts into `task_history`;
- an ORM write rooted at `TaskHistory`: `.update(...)` naming `state` or `stages` (or
  passing `**fields`, which may), `.create`, `.bulk_create`, `.bulk_update`, `.get_or_create`,
  `.update_or_create`;
- `.save()` on a `TaskHistory` instance (a name bound to `TaskHistory(...)` or to a
  `TaskHistory.objects` lookup, or a parameter annotated `TaskHistory`): a save writes every
  column, state included.

A finding names the file and line. Reads are not writes: lookups, `values_list`, `exists` and
SQL `SELECT`s anywhere are fine.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("orchestrator", "coverage", "lumastra", "tasks")
WRITER = ROOT / "orchestrator" / "stores" / "durable.py"
WRITER_SQL = ROOT / "orchestrator" / "stores" / "sql"

_SQL_WRITE = re.compile(r"\b(UPDATE\s+(ONLY\s+)?|INSERT\s+INTO\s+)task_history\b", re.IGNORECASE)
_ROW_WRITES = {"create", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}
_STATE_FIELDS = {"state", "stages"}


def _exempt(path: Path) -> bool:
    return path == WRITER or path.is_relative_to(WRITER_SQL) or "migrations" in path.parts


def _files(suffix: str) -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob(f"*{suffix}")):
            if not _exempt(path):
                yield path


def _mentions_model(node: ast.AST | None) -> bool:
    return node is not None and any(
        isinstance(n, ast.Name) and n.id == "TaskHistory" for n in ast.walk(node)
    )


def _rows_bound(tree: ast.AST) -> set[str]:
    """Names that hold TaskHistory rows or querysets somewhere in the module (assigned from an
    expression naming the model, or a parameter annotated with it)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _mentions_model(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.arg) and _mentions_model(node.annotation):
            target = node.target if isinstance(node, ast.AnnAssign) else node
            if isinstance(target, ast.Name):
                names.add(target.id)
            elif isinstance(target, ast.arg):
                names.add(target.arg)
    return names


def _root(node: ast.expr) -> ast.expr:
    """`rows` of `rows.filter(...).exclude(...)`."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def python_findings(path: Path, source: str) -> list[str]:
    tree = ast.parse(source, filename=str(path))
    rows = _rows_bound(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _SQL_WRITE.search(node.value):
                found.append(f"{where}: SQL that writes task_history")
            continue
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, receiver = node.func.attr, node.func.value
        root = _root(receiver)
        model = _mentions_model(receiver) or (isinstance(root, ast.Name) and root.id in rows)
        if method == "save" and isinstance(receiver, ast.Name) and receiver.id in rows:
            found.append(f"{where}: {receiver.id}.save() writes a TaskHistory row")
        elif model and method in _ROW_WRITES:
            found.append(f"{where}: TaskHistory .{method}() writes rows")
        elif model and method == "update":
            named = {k.arg for k in node.keywords}
            if None in named or named & _STATE_FIELDS:
                fields = sorted(str(k) for k in named & _STATE_FIELDS) or ["**"]
                found.append(f"{where}: TaskHistory .update({', '.join(fields)}) writes state")
    return found


def sql_findings(path: Path, text: str) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: "
        "SQL that writes task_history"
        for match in _SQL_WRITE.finditer(text)
    ]


def test_only_the_writer_writes_run_state() -> None:
    found: list[str] = []
    for path in _files(".py"):
        found += python_findings(path, path.read_text())
    for path in _files(".sql"):
        found += sql_findings(path, path.read_text())

    assert found == [], "run state written outside orchestrator/stores/durable.py:\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("source", "finding"),
    [
        (
            "from orchestrator.models import TaskHistory\n"
            "TaskHistory.objects.filter(id=1).update(state='failed')\n",
            "TaskHistory .update(state) writes state",
        ),
        (
            "from orchestrator.models import TaskHistory\n"
            "TaskHistory.objects.filter(id=1).update(**fields)\n",
            "TaskHistory .update(**) writes state",
        ),
        (
            "from orchestrator.models import TaskHistory\n"
            "def f(row: TaskHistory) -> None:\n"
            "    row.state = 'failed'\n"
            "    row.save()\n",
            "row.save() writes a TaskHistory row",
        ),
        (
            "from orchestrator.models import TaskHistory\n"
            "run = TaskHistory.objects.get(id=1)\n"
            "run.save(update_fields=['state'])\n",
            "run.save() writes a TaskHistory row",
        ),
        (
            "from orchestrator.models import TaskHistory\n"
            "rows = TaskHistory.objects.filter(id=1)\n"
            "rows.filter(state='active').update(state='pending', error=None)\n",
            "TaskHistory .update(state) writes state",
        ),
        (
            "from orchestrator.models import TaskHistory\n"
            "TaskHistory.objects.create(id='run_x', state='failed')\n",
            "TaskHistory .create() writes rows",
        ),
        (
            "_FAIL = '''\nUPDATE task_history SET state = 'failed' WHERE id = %s\n'''\n",
            "SQL that writes task_history",
        ),
    ],
)
def test_each_kind_of_write_is_found(source: str, finding: str) -> None:
    path = ROOT / "orchestrator" / "recovery" / "example.py"

    (found,) = python_findings(path, source)

    assert found.startswith("orchestrator/recovery/example.py:")
    assert found.endswith(finding)


def test_reads_and_other_tables_are_not_writes() -> None:
    path = ROOT / "orchestrator" / "admin" / "example.py"
    source = (
        "from orchestrator.models import TaskCircuitState, TaskHistory\n"
        "TaskHistory.objects.filter(state='active').values_list('id', flat=True)\n"
        "TaskHistory.objects.filter(id=1).exists()\n"
        "TaskCircuitState.objects.filter(task_id='x').update(state='open')\n"
        "SQL = 'SELECT state FROM task_history; INSERT INTO task_history_audit VALUES (1)'\n"
    )

    assert python_findings(path, source) == []


def test_sql_files_are_scanned_by_line() -> None:
    path = ROOT / "coverage" / "sql" / "example.sql"
    text = "-- a comment\nSELECT 1;\nupdate  task_history set state = 'failed';\n"

    assert sql_findings(path, text) == ["coverage/sql/example.sql:3: SQL that writes task_history"]
