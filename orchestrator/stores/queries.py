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
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from orchestrator import sql

_PARAMETER = re.compile(r"%\((\w+)\)s")


@dataclass(frozen=True)
class Prepared:
    """A named query with its prepared form: `$n` for each distinct `%(name)s`, in order."""

    name: str
    text: str
    prepare: str
    execute: str

    @classmethod
    def load(cls, name: str) -> Prepared:
        text = sql.load(__file__, name)
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
            statement = query.execute if seen == _PREPARED else f"{query.prepare};\n{query.execute}"
            _send_prepared(cursor, query, statement, params, before, uses)
            return
        uses[query.name] = seen + 1
    cursor.execute(before + query.text, params)


def _send_prepared(
    cursor: Any,
    query: Prepared,
    statement: str,
    params: dict[str, Any],
    before: str,
    uses: dict[str, int],
) -> None:
    try:
        cursor.execute(before + statement, params)
    except DatabaseError as exc:
        code = getattr(exc.__cause__, "pgcode", None)
        if code == _UNKNOWN_STATEMENT:
            uses[query.name] = _NEVER
            if not cursor.db.in_atomic_block:
                # Nothing ran and no transaction was spoiled: send it again, as text.
                cursor.execute(before + query.text, params)
                return
        elif statement != query.execute and code != _IN_FAILED_TRANSACTION:
            # PREPARE went first and outlives the failure of what followed it.
            uses[query.name] = _PREPARED
        raise
    uses[query.name] = _PREPARED


CLAIM_RUN = Prepared.load("claim_run")
READ_CLAIMABLE = Prepared.load("read_claimable")
END_RUN = Prepared.load("end_run")
INSERT_RUN = Prepared.load("insert_run")
CANCEL_RUN = sql.load(__file__, "cancel_run")
REQUEST_CANCEL = sql.load(__file__, "request_cancel")
PUT_BACK_RUN = sql.load(__file__, "put_back_run")
END_ORPHAN = sql.load(__file__, "end_orphan")
FAIL_PENDING = sql.load(__file__, "fail_pending")
HEARTBEAT_STALE = sql.load(__file__, "heartbeat_stale")
RUN_STATE = sql.load(__file__, "run_state")
CLAIM_STAGE = sql.load(__file__, "claim_stage")
MOVE_STAGE = sql.load(__file__, "move_stage")
REUSE_STAGES = sql.load(__file__, "reuse_stages")
LIVE_RUN_WITH_KEY = sql.load(__file__, "live_run_with_key")
RELEASE_DUE = sql.load(__file__, "release_due")
INSERT_RUNS = sql.load(__file__, "insert_runs")
# Operator reads (the admin's Tasks page, `admin/stats.py`): not on a run's path.
TASK_STATS = sql.load(__file__, "task_stats")
LAST_RUNS = sql.load(__file__, "last_runs")
# Recovery's (`recovery.orphans`, `recovery.stages`, `recovery.drain_replay`).
ORPHAN_CANDIDATES = sql.load(__file__, "orphan_candidates")
STALLED_PIPELINES = sql.load(__file__, "stalled_pipelines")
HELD_PIPELINES = sql.load(__file__, "held_pipelines")  # `recovery.pauses`
DRAIN_LOCK_TIMEOUT = sql.load(__file__, "drain_lock_timeout")
# The hooks' own tables: quotas and costs (`hooks.quotas`, `hooks.costs`: task_quota_usage),
# the circuit's Postgres copy (`hooks.circuit`: task_circuit_state).
QUOTA_TAKE = sql.load(__file__, "quota_take")
QUOTA_GIVE_BACK = sql.load(__file__, "quota_give_back")
QUOTA_COUNT_END = sql.load(__file__, "quota_count_end")
QUOTA_ROLLUP = sql.load(__file__, "quota_rollup")
COST_ROLLUP = sql.load(__file__, "cost_rollup")
COST_ROLLED_UP = sql.load(__file__, "cost_rolled_up")
CIRCUIT_PERSIST = sql.load(__file__, "circuit_persist")
