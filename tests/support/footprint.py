"""Which project functions one run executes: a `sys.setprofile` recorder and its report.

Style item 15 and issue 37: the code a run executes is the code a reader has to open, so it
is counted. `Recorder.profile` is a profile function (`sys.setprofile`, and
`threading.setprofile` for the threads a process starts later); while armed it counts every
call of a Python function defined in a project file, by thread, file and qualified name.

Project files are the modules under `lumastra/`, `orchestrator/`, `tasks/` and `coverage/`:
not `tests/` (a test task's handler is not the engine's), not `.venv` (Django, Celery, kombu,
redis-py, psycopg2 are not counted, however much of them a run calls). C functions are not
counted. A comprehension or generator expression is part of the function it is written in
(it has a code object of its own in Python 3.11: counted as calls, not as a function); a
lambda is a function. A generator's resumption is a call, so its count is how often it ran.

The measuring itself (the worker's side: `tests/support/footprint_worker.py`; the caller's
and the window: `tests/integration/test_footprint.py`) decides what the window holds.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lumastra", "orchestrator", "tasks", "coverage")
_PREFIXES = tuple(f"{ROOT / package}/" for package in PACKAGES)
# Code objects of their own that belong to the function they are written in.
_INLINE = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")

# (thread, file relative to the project root, qualified name) -> calls
Calls = dict[tuple[str, str, str], int]


class Recorder:
    """A profile function that counts project calls while `armed`. `stop_at`: a code object
    (of any package) whose call disarms it in every thread at once: the end of the window."""

    def __init__(self, stop_at: Any = None) -> None:
        self.armed = False
        self.stopped = False  # disarmed by a call of `stop_at`
        self.calls: Calls = {}
        self._stop_at = stop_at

    def reset(self) -> None:
        self.armed = False
        self.stopped = False
        self.calls = {}

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        # Called for every call, return and C call of every thread it is installed in: the
        # cheap tests first. CPython does not profile the profile function itself.
        if not self.armed or event != "call":
            return
        code = frame.f_code
        if code is self._stop_at:
            self.armed = False
            self.stopped = True
            return
        filename = code.co_filename
        if not filename.startswith(_PREFIXES):
            return
        key = (threading.current_thread().name, filename, code.co_qualname)
        self.calls[key] = self.calls.get(key, 0) + 1

    def snapshot(self) -> Calls:
        """What was recorded, with files relative to the project root."""
        return {
            (thread, os.path.relpath(filename, ROOT), name): calls
            for (thread, filename, name), calls in list(self.calls.items())
        }


def dump(calls: Calls, stopped: bool, path: Path) -> None:
    """Written whole or not at all (the reader waits for the file to appear)."""
    partial = path.with_suffix(".partial")
    rows = [[*key, count] for key, count in sorted(calls.items())]
    partial.write_text(json.dumps({"stopped": stopped, "calls": rows}))
    partial.rename(path)


def load(path: Path) -> tuple[Calls, bool]:
    data = json.loads(path.read_text())
    return {(t, f, n): c for t, f, n, c in data["calls"]}, bool(data["stopped"])


def _enclosing(name: str) -> str:
    """The function a comprehension is written in (`<module>` for a module's top level)."""
    while name.endswith(_INLINE):
        outer = name.rsplit(".", 1)[0] if "." in name else "<module>"
        name = outer.removesuffix(".<locals>")
    return name


@dataclass
class Footprint:
    """The functions one run executed, each with where it ran (`caller`, or the worker's
    thread) and how often: file -> function -> {where: calls}."""

    files: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @classmethod
    def of(cls, sides: Mapping[str, Calls]) -> Footprint:
        """`sides`: the caller's and the worker's recordings, by a label ("caller",
        "worker"); a worker's calls are labelled by their thread."""
        footprint = cls()
        for side, calls in sides.items():
            for (thread, file, name), count in calls.items():
                where = side if side == "caller" else f"{side}:{thread}"
                function = _enclosing(name)
                per_where = footprint.files.setdefault(file, {}).setdefault(function, {})
                per_where[where] = per_where.get(where, 0) + count
        return footprint

    @classmethod
    def in_every(cls, runs: Iterable[Footprint]) -> Footprint:
        """The functions every one of `runs` executed (the fewest calls seen in any): a
        timer's tick that fell in one run's window is not part of what a run executes."""
        runs = list(runs)
        common = cls()
        for file, functions in runs[0].files.items():
            for function, wheres in functions.items():
                seen = [run.files.get(file, {}).get(function) for run in runs]
                if all(seen):
                    merged = {
                        where: min(s.get(where, 0) for s in seen if s is not None)
                        for where in wheres
                    }
                    common.files.setdefault(file, {})[function] = merged
        return common

    def functions(self) -> int:
        return sum(len(functions) for functions in self.files.values())

    def minus(self, other: Footprint) -> list[str]:
        """`file:function` of this footprint that `other` lacks."""
        return [
            f"{file}:{function}"
            for file, functions in sorted(self.files.items())
            for function in sorted(functions)
            if function not in other.files.get(file, {})
        ]

    def report(self) -> str:
        lines = [f"{len(self.files)} files, {self.functions()} functions"]
        for file, functions in sorted(self.files.items()):
            lines.append(f"\n{file} ({len(functions)})")
            for function, wheres in sorted(functions.items()):
                where = ", ".join(f"{w}: {c}" for w, c in sorted(wheres.items()))
                lines.append(f"    {function}  [{where}]")
        return "\n".join(lines)
