"""Each package's docstring lists its modules (issue 24): every module and direct subpackage
of every package under the four roots is named in its `__init__.py`'s docstring, in
backticks, so a newcomer opening a package reads what each file is for before opening it.

The tree is walked, not compared against a list kept here: a module added without a line in
its package's docstring fails this test. `migrations` folders are Django's and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("lumastra", "orchestrator", "tasks", "coverage")
SKIPPED = {"migrations"}


def _packages(root: Path) -> list[Path]:
    """Every package folder under `root`'s roots (a folder with `__init__.py`), but migrations."""
    return sorted(
        init.parent
        for name in ROOTS
        for init in (root / name).rglob("__init__.py")
        if not SKIPPED & set(init.relative_to(root).parts)
    )


def _members(package: Path) -> list[str]:
    """The names a package's docstring must give: its modules and its direct subpackages."""
    modules = [path.stem for path in package.glob("*.py") if path.name != "__init__.py"]
    subpackages = [
        path.name
        for path in package.iterdir()
        if path.is_dir() and path.name not in SKIPPED and (path / "__init__.py").is_file()
    ]
    return sorted(modules + subpackages)


def _docstring(package: Path) -> str:
    tree = ast.parse((package / "__init__.py").read_text(), filename=str(package))
    return ast.get_docstring(tree) or ""


def _missing(root: Path) -> dict[str, list[str]]:
    """Package (relative to `root`) → the names its docstring does not give in backticks."""
    found: dict[str, list[str]] = {}
    for package in _packages(root):
        docstring = _docstring(package)
        missing = [name for name in _members(package) if f"`{name}`" not in docstring]
        if missing:
            found[str(package.relative_to(root))] = missing
    return found


def test_the_walk_finds_the_packages() -> None:
    # Guards the walk itself: a moved root or a broken glob must not make the check vacuous.
    packages = {str(package.relative_to(ROOT)) for package in _packages(ROOT)}

    assert set(ROOTS) <= packages
    assert {"orchestrator/runs", "orchestrator/management/commands", "tasks/definitions"} <= (
        packages
    )
    assert not any("migrations" in package for package in packages)
    assert "start" in _members(ROOT / "orchestrator" / "runs")
    assert "commands" in _members(ROOT / "coverage" / "management")


def test_every_package_docstring_names_its_modules_and_subpackages() -> None:
    missing = _missing(ROOT)

    assert not missing, "add a line for each to its package's docstring: " + "; ".join(
        f"{package} → {', '.join(names)}" for package, names in sorted(missing.items())
    )


def test_a_module_added_without_a_line_is_found(tmp_path: Path) -> None:
    package = tmp_path / "tasks" / "example"
    (package / "inner").mkdir(parents=True)
    (package / "migrations").mkdir()
    (tmp_path / "tasks" / "__init__.py").write_text('"""- `example`: an example."""\n')
    (package / "__init__.py").write_text('"""- `listed`: is listed.\n\nAlso `inner.x`."""\n')
    (package / "listed.py").write_text("")
    (package / "unlisted.py").write_text("")
    (package / "inner" / "__init__.py").write_text('"""Nothing listed."""\n')
    (package / "inner" / "deeper.py").write_text("")
    (package / "migrations" / "__init__.py").write_text("")
    (package / "migrations" / "0001_initial.py").write_text("")

    assert _missing(tmp_path) == {
        "tasks/example": ["inner", "unlisted"],
        "tasks/example/inner": ["deeper"],
    }
