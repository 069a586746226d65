"""Every `.sql` file says what it takes, and one module reads them (`orchestrator/sql.py`, whose
docstring gives the conventions).

- A file's header (its leading comment lines) has a `Parameters:` line, and every pyformat
  parameter (`%(name)s`) in the file is a word of the header after it: a parameter added to a
  statement without a word in its header fails here.
- No module of the project reads a `.sql` file itself: a second reader would be a second place
  to know where the files are and what they hold.
- Recovery and the hooks send no SQL text of their own: their statements are named files under
  `orchestrator/stores/sql/` (`orchestrator.stores.queries`), where the first check sees them.

No database: the files and the modules are read as text.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {".venv", ".git", ".pytest_cache"}
MODULES = ("orchestrator", "coverage", "lumastra", "tasks", "bench")
LOADER = ROOT / "orchestrator" / "sql.py"
NO_INLINE_SQL = ("orchestrator/recovery", "orchestrator/hooks")

_PARAMETER = re.compile(r"(?<!%)%\((\w+)\)s")
_READS = {"read_text", "read_bytes", "open"}
_SQL_WORD = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|WITH|SET|RESET|LOCK|TRUNCATE|VACUUM|EXPLAIN)\b", re.I
)


def sql_files(root: Path) -> list[Path]:
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED]
        found += [Path(folder) / name for name in files if name.endswith(".sql")]
    return sorted(found)


def header(text: str) -> str:
    """The leading comment block: the comment and blank lines before the first line of SQL."""
    lines = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("--"):
            break
        lines.append(line.lstrip().removeprefix("--"))
    return "\n".join(lines)


def parameter_problems(text: str) -> list[str]:
    head = header(text)
    if "Parameters:" not in head:
        return ["its header has no `-- Parameters:` line"]
    named = set(re.findall(r"\w+", head.split("Parameters:", 1)[1]))
    used = set(_PARAMETER.findall(text))
    return [f"`%({name})s` is not named after `Parameters:`" for name in sorted(used - named)]


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def reads_sql_itself(source: str) -> bool:
    """A module names a `.sql` file in its code (not its docstrings) and reads a file."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    names_sql = any(
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and ".sql" in node.value
        and id(node) not in docstrings
        for node in ast.walk(tree)
    )
    reads = any(
        isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr in _READS)
            or (isinstance(node.func, ast.Name) and node.func.id == "open")
        )
        for node in ast.walk(tree)
    )
    return names_sql and reads


def _sql_text(node: ast.expr) -> bool:
    """A string literal, f-string or concatenation of them with SQL in it."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and bool(_SQL_WORD.search(node.value))
    if isinstance(node, ast.JoinedStr):
        return any(_sql_text(part) for part in node.values)
    if isinstance(node, ast.BinOp):
        return _sql_text(node.left) or _sql_text(node.right)
    return False


def inline_sql(source: str) -> list[int]:
    """Lines of `.execute(...)` calls whose statement is SQL text written in the module: a
    literal, or a name the module binds to one."""
    tree = ast.parse(source)
    literals = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _sql_text(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    } | {
        node.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and node.value is not None
        and _sql_text(node.value)
        and isinstance(node.target, ast.Name)
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"execute", "executemany"}
        and node.args
        and (
            _sql_text(node.args[0])
            or (isinstance(node.args[0], ast.Name) and node.args[0].id in literals)
        )
    ]


def _modules(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def test_the_walk_finds_every_kind_of_sql_file() -> None:
    # Guards the walk: a moved folder or a broken filter must not make the checks vacuous.
    found = {str(path.relative_to(ROOT)) for path in sql_files(ROOT)}

    assert {
        "orchestrator/stores/sql/end_run.sql",
        "orchestrator/scheduler/sql/claim_slot.sql",
        "orchestrator/migrations/sql/0017_heartbeat_stale.sql",
        "coverage/sql/candidates.sql",
        "coverage/migrations/sql/0004_run_triggers.sql",
        "bench/sql/console_history.sql",
    } <= found
    assert not any(part in SKIPPED for path in found for part in Path(path).parts)


def test_every_sql_file_names_its_parameters() -> None:
    problems = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in sql_files(ROOT)
        for problem in parameter_problems(path.read_text())
    ]

    assert problems == [], "\n".join(problems)


def test_the_parameter_check_finds_a_missing_line_and_an_unnamed_parameter() -> None:
    named = "-- What and why.\n-- Parameters: run_id, stale_s (seconds).\nSELECT %(run_id)s"

    assert parameter_problems(named) == []
    assert parameter_problems("-- Parameters: none.\nSELECT 1 %% 2") == []
    assert parameter_problems("-- What and why.\nSELECT 1") == [
        "its header has no `-- Parameters:` line"
    ]
    assert parameter_problems(named + ", %(owner)s") == [
        "`%(owner)s` is not named after `Parameters:`"
    ]
    # A word before `Parameters:` does not count.
    assert parameter_problems("-- owner.\n-- Parameters: none.\nSELECT %(owner)s") != []


def test_only_the_loader_reads_sql_files() -> None:
    readers = [
        str(path.relative_to(ROOT))
        for path in _modules(*MODULES)
        if path != LOADER and reads_sql_itself(path.read_text())
    ]

    assert reads_sql_itself(LOADER.read_text())
    assert readers == [], f"read them with orchestrator.sql.load: {readers}"


def test_the_reader_check_finds_a_module_reading_its_own_file() -> None:
    docstring_only = '"""Reads `claim_slot.sql`."""\nfrom orchestrator import sql\n'

    assert reads_sql_itself('TEXT = (DIR / "claim_slot.sql").read_text()\n')
    assert reads_sql_itself('TEXT = Path(__file__).with_name(f"{NAME}.sql").read_text()\n')
    assert reads_sql_itself('with open("x.sql") as f:\n    TEXT = f.read()\n')
    assert not reads_sql_itself(docstring_only + 'TEXT = sql.load(__file__, "claim_slot")\n')


def test_recovery_and_the_hooks_send_no_sql_text_of_their_own() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules(*NO_INLINE_SQL)
        for line in inline_sql(path.read_text())
    ]

    assert found == [], f"move each to orchestrator/stores/sql/ (stores.queries): {found}"


def test_the_inline_check_finds_literals_f_strings_and_names_bound_to_them() -> None:
    assert inline_sql("cursor.execute(\"SELECT set_config('x', %s, true)\", [v])\n") == [1]
    assert inline_sql('cursor.execute(f"SELECT {column} FROM t")\n') == [1]
    assert inline_sql('_Q = """\nUPDATE t SET a = 1\n"""\n\ncursor.execute(_Q, {})\n') == [5]
    assert inline_sql("cursor.execute(queries.QUOTA_TAKE, {})\nvalkey.execute(pipe)\n") == []
