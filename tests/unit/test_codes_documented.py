"""Every diagnostic code the API and the runs can answer is in docs/operations.md: the error
kinds a run ends with (`error.kind`) and every refusal `code`, found in the source itself, so
a new one cannot be forgotten."""

from __future__ import annotations

import ast
import re

from tasks.errors import ErrorKind
from tests.support.fixtures import ROOT

SOURCES = ("orchestrator", "lumastra", "coverage")


def _refusal_codes() -> set[str]:
    """`code = "..."` in a class body (a refusal's code) and `code="..."` passed to a call,
    except Django form validation codes, which no client sees."""
    codes: set[str] = set()
    for package in SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    for stmt in node.body:
                        if (
                            isinstance(stmt, ast.Assign | ast.AnnAssign)
                            and _named(stmt, "code")
                            and isinstance(stmt.value, ast.Constant)
                            and isinstance(stmt.value.value, str)
                        ):
                            codes.add(stmt.value.value)
                elif isinstance(node, ast.Call) and not _is_form_error(node):
                    codes.update(
                        kw.value.value
                        for kw in node.keywords
                        if kw.arg == "code"
                        and isinstance(kw.value, ast.Constant)
                        and isinstance(kw.value.value, str)
                    )
    return codes


def _named(stmt: ast.Assign | ast.AnnAssign, name: str) -> bool:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def _is_form_error(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == "ValidationError"


def test_the_scan_finds_the_codes_it_should() -> None:
    # A scan that found nothing would pass trivially.
    assert {"queue_full", "circuit_open", "batch_refused", "replayed"} <= _refusal_codes()


def test_every_code_and_error_kind_is_documented() -> None:
    documented = set(re.findall(r"`([a-z_]+)`", (ROOT / "docs" / "operations.md").read_text()))
    codes = _refusal_codes() | {kind.value for kind in ErrorKind}
    assert sorted(codes - documented) == []
