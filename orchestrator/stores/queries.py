"""The engine's hot-path SQL: named queries, one `.sql` file each under `sql/`.

Each file says what it guards and lists its parameters (pyformat: `%(name)s`). The text is read
once, at import; nothing here builds SQL at call time, so a run's writes cost psycopg's
parameter binding and the round trip, not Django's query compiler.

The statements every run sends (`INSERT_RUN`, `READ_CLAIMABLE` or `CLAIM_RUN`, `END_RUN`) are
`Prepared`: each also has the `PREPARE` and `EXECUTE` forms `durable.send` sends them in, kept
as server-side prepared statements on each connection that uses them often, as psycopg 3 does
with its `prepare_threshold` (`stores.durable` says how).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


CLAIM_RUN = Prepared.load("claim_run")
READ_CLAIMABLE = Prepared.load("read_claimable")
END_RUN = Prepared.load("end_run")
INSERT_RUN = Prepared.load("insert_run")
# A debounced start's own two (`runs.coalesce`): sent on every such start.
DEBOUNCE_RUN = Prepared.load("debounce_run")
INSERT_DEBOUNCED = Prepared.load("insert_debounced")
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
# Batches and children (`runs.batch`, `runs.children`).
INSERT_BATCH = sql.load(__file__, "insert_batch")
RELEASE_BATCHES = sql.load(__file__, "release_batches")
BATCH_CALLBACKS = sql.load(__file__, "batch_callbacks")
BATCHES_OF_PARENT = sql.load(__file__, "batches_of_parent")
CHILDREN_OF = sql.load(__file__, "children_of")
LIVE_DESCENDANTS = sql.load(__file__, "live_descendants")
CHILDREN_LEFT = sql.load(__file__, "children_left")
FOLLOW_RUN = sql.load(__file__, "follow_run")
JOIN_FOLLOW_UP = sql.load(__file__, "join_follow_up")
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
