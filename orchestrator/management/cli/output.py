"""What the CLI prints: an aligned plain table by default, one JSON document with `--json`.

JSON is rendered by the API's own encoder from the API's own schemas, so `--json` prints the
document the API answers for the same operation (`show` is `GET /runs/{id}`, `runs` is
`GET /runs`, ...). Errors go to stderr, never into the document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import OutputWrapper
from ninja.responses import NinjaJSONEncoder

Row = Sequence[object]


class Output:
    def __init__(self, stdout: OutputWrapper, stderr: OutputWrapper, as_json: bool) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.json = as_json

    def emit(self, document: Any, headers: Row | None, rows: Sequence[Row]) -> None:
        """`document` as JSON with --json, else `rows` as a table (under `headers`, if any)."""
        if self.json:
            self.stdout.write(json.dumps(document, cls=NinjaJSONEncoder, indent=2))
        else:
            self.stdout.write(table(headers, rows))

    def event(self, document: Any) -> None:
        """One JSON document on a line of its own (`watch --json`: a line per event)."""
        self.stdout.write(json.dumps(document, cls=NinjaJSONEncoder))
        self.stdout.flush()

    def line(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def note(self, text: str) -> None:
        """For the person at the terminal, beside the output: on stderr, not styled as an
        error (Django's stderr is, by default)."""
        self.stderr.write(text, style_func=_plain)


def _plain(text: str) -> str:
    return text


def table(headers: Row | None, rows: Sequence[Row]) -> str:
    shown = [[cell(value) for value in row] for row in rows]
    if headers is not None:
        shown.insert(0, [str(header) for header in headers])
    if not shown:
        return ""
    widths = [max(len(row[n]) for row in shown) for n in range(len(shown[0]))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        for row in shown
    )


def cell(value: object) -> str:
    """One table cell: `-` for nothing, UTC times to the second, one line."""
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        value = json.dumps(value, cls=NinjaJSONEncoder)
    return " ".join(str(value).split())
