"""The engine's hot-path SQL: named queries, one `.sql` file each under `sql/`.

Each file says what it guards and lists its parameters (pyformat: `%(name)s`). The text is read
once, at import; nothing here builds SQL at call time, so a run's writes cost psycopg's
parameter binding and the round trip, not Django's query compiler.
"""

from __future__ import annotations

from pathlib import Path

SQL_DIR = Path(__file__).parent / "sql"


def _load(name: str) -> str:
    return (SQL_DIR / f"{name}.sql").read_text()


CLAIM_RUN = _load("claim_run")
END_RUN = _load("end_run")
CANCEL_RUN = _load("cancel_run")
RUN_STATE = _load("run_state")
TRANSITION_STAGE = _load("transition_stage")
INSERT_RUN = _load("insert_run")
LIVE_RUN_WITH_KEY = _load("live_run_with_key")
