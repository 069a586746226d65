"""The one reader of the project's `.sql` files: `load(__file__, name)` is the text of
`sql/<name>.sql` in the calling module's folder.

A file holds one statement (under `migrations/sql/`, the DDL one migration step applies) after
a header comment that says what it does and why, and a `-- Parameters:` line naming every pyformat
parameter of the statement (`-- Parameters: none.` when it has none), so its caller's reader
learns what to pass without reading the SQL. tests/unit/test_sql_files.py holds every file to
this and every module to reading them here. A header never holds a bare percent sign: psycopg
reads the comments of a statement sent with parameters too. Coverage's `${eligible}` slot, filled
before a statement is sent, is not a parameter: coverage/queries.py says what goes there. What a
released migration's file does never changes (databases ran it already): a change is a new file
and a new migration.
"""

from __future__ import annotations

from pathlib import Path


def load(beside: str, name: str) -> str:
    """The text of `<folder of beside>/sql/<name>.sql`; callers pass their `__file__`."""
    return (Path(beside).parent / "sql" / f"{name}.sql").read_text()
