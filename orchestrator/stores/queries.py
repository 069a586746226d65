"""The engine's hot-path SQL: named queries, one `.sql` file each under `sql/`.

Each file says what it guards and lists its parameters (pyformat: `%(name)s`). The text is read
once, at import; nothing here builds SQL at call time, so a run's writes cost psycopg's
parameter binding and the round trip, not Django's query compiler.

The statements every run sends (`INSERT_RUN`, `READ_CLAIMABLE` or `CLAIM_RUN`, `END_RUN`) are
kept as server-side prepared statements on each connection that uses them often, as psycopg 3
does with its `prepare_threshold`: Postgres then skips parsing and planning them, which was about
40 % of their cost (issue 9, docs/benchmarks.md). `send` sends a query as text for its first
LUMASTRA_DB_PREPARE_THRESHOLD - 1 uses on a connection, then `PREPARE` and `EXECUTE` in one
round trip, then `EXECUTE` alone. A connection that lives for one request never prepares.
`PREPARE` is not undone by a rollback, so a failed first `EXECUTE` still leaves the statement
prepared. A statement the server forgot (a `DISCARD ALL`) is sent again as text at once (outside
a transaction; inside one the error stands, as for any failed statement), and that query goes
as text on that connection from then on. Set the threshold to
0 behind a pooler that shares server connections between clients (PgBouncer in transaction
mode), where a session's prepared statements are not the client's.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError

SQL_DIR = Path(__file__).parent / "sql"
_PARAMETER = re.compile(r"%\((\w+)\)s")


def _load(name: str) -> str:
    return (SQL_DIR / f"{name}.sql").read_text()


@dataclass(frozen=True)
class Prepared:
    """A named query with its prepared form: `$n` for each distinct `%(name)s`, in order."""

    name: str
    text: str
    prepare: str
    execute: str

    @classmethod
    def load(cls, name: str) -> Prepared:
        text = _load(name)
        order = list(dict.fromkeys(_PARAMETER.findall(text)))
        positional = _PARAMETER.sub(lambda m: f"${order.index(m.group(1)) + 1}", text)
        statement = f"lumastra_{name}"
        arguments = ", ".join(f"%({parameter})s" for parameter in order)
        return cls(
            name,
            text,
            f"PREPARE {statement} AS\n{positional}",
            f"EXECUTE {statement}({arguments})",
        )


_UNKNOWN_STATEMENT = "26000"  # invalid_sql_statement_name: the server forgot it
_IN_FAILED_TRANSACTION = "25P02"  # nothing ran, PREPARE included
_NEVER = -1  # on this connection, send as text
_PREPARED = -2
# Per raw connection: uses so far of each query, or one of the two markers above. A new
# connection (Django reconnects after an error or past its age) starts from nothing.
_uses: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def send(cursor: Any, query: Prepared | str, params: dict[str, Any], *, before: str = "") -> None:
    """Execute a named query on a Django cursor, prepared once its connection uses it often
    (a `Prepared`) or as text (a plain query); `before` is sent first in the same round trip (a
    `SET LOCAL` for the statement's own implicit transaction)."""
    if isinstance(query, str):
        cursor.execute(before + query, params)
        return
    uses = _uses.setdefault(cursor.cursor.connection, {})
    seen = uses.get(query.name, 0)
    threshold = settings.CONFIG.db_prepare_threshold
    if threshold > 0 and seen != _NEVER:
        if seen == _PREPARED or seen + 1 >= threshold:
            sql = query.execute if seen == _PREPARED else f"{query.prepare};\n{query.execute}"
            _send_prepared(cursor, query, sql, params, before, uses)
            return
        uses[query.name] = seen + 1
    cursor.execute(before + query.text, params)


def _send_prepared(
    cursor: Any,
    query: Prepared,
    sql: str,
    params: dict[str, Any],
    before: str,
    uses: dict[str, int],
) -> None:
    try:
        cursor.execute(before + sql, params)
    except DatabaseError as exc:
        code = getattr(exc.__cause__, "pgcode", None)
        if code == _UNKNOWN_STATEMENT:
            uses[query.name] = _NEVER
            if not cursor.db.in_atomic_block:
                # Nothing ran and no transaction was spoiled: send it again, as text.
                cursor.execute(before + query.text, params)
                return
        elif sql != query.execute and code != _IN_FAILED_TRANSACTION:
            # PREPARE went first and outlives the failure of what followed it.
            uses[query.name] = _PREPARED
        raise
    uses[query.name] = _PREPARED


CLAIM_RUN = Prepared.load("claim_run")
READ_CLAIMABLE = Prepared.load("read_claimable")
END_RUN = Prepared.load("end_run")
INSERT_RUN = Prepared.load("insert_run")
CANCEL_RUN = _load("cancel_run")
REQUEST_CANCEL = _load("request_cancel")
PUT_BACK_RUN = _load("put_back_run")
END_ORPHAN = _load("end_orphan")
FAIL_PENDING = _load("fail_pending")
HEARTBEAT_STALE = _load("heartbeat_stale")
RUN_STATE = _load("run_state")
CLAIM_STAGE = _load("claim_stage")
MOVE_STAGE = _load("move_stage")
REUSE_STAGES = _load("reuse_stages")
LIVE_RUN_WITH_KEY = _load("live_run_with_key")
# Operator reads (the admin's Tasks page, `runs/stats.py`): not on a run's path.
TASK_STATS = _load("task_stats")
LAST_RUNS = _load("last_runs")
