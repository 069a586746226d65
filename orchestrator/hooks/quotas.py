"""Daily quotas: counts each task's admitted, completed and failed runs per UTC day, and
refuses starts past `quotas.max_runs_per_day`.

The admit counter is taken inside start_run's transaction, so a start whose caller rolls back
gives its unit back; a start refused, dropped or deduplicated after the unit was taken gives
it back through `abandoned`. Counts are per UTC day; a run admitted just
before midnight that finishes after it counts as started on one day and finished on the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta

from django.db import connection

from orchestrator.clock import SYSTEM, Clock
from orchestrator.hooks.base import Admission, Outcome, Refused, RunHook
from orchestrator.states import RunState

# One statement takes a unit or refuses: the conditional DO UPDATE returns no row when the
# day's count has reached the cap (NULL cap: no limit).
_TAKE = """
INSERT INTO task_quota_usage AS u (task_id, day, started, completed, failed)
VALUES (%(task_id)s, %(day)s, 1, 0, 0)
ON CONFLICT (task_id, day) DO UPDATE SET started = u.started + 1
 WHERE %(cap)s::int IS NULL OR u.started < %(cap)s::int
RETURNING started
"""

_GIVE_BACK = """
UPDATE task_quota_usage SET started = started - 1
 WHERE task_id = %(task_id)s AND day = %(day)s AND started > 0
"""

_COUNT_END = """
INSERT INTO task_quota_usage AS u (task_id, day, started, completed, failed)
VALUES (%(task_id)s, %(day)s, 0, %(completed)s, %(failed)s)
ON CONFLICT (task_id, day) DO UPDATE
   SET completed = u.completed + %(completed)s, failed = u.failed + %(failed)s
"""


class QuotaExceeded(Refused):
    code = "quota_exceeded"
    http_status = 429


@dataclass
class DailyQuota(RunHook):
    name: str = "quota"
    clock: Clock = SYSTEM

    def admit(self, admission: Admission) -> None:
        cap = admission.definition.quotas.max_runs_per_day
        now = self.clock.now()
        with connection.cursor() as cursor:
            cursor.execute(
                _TAKE, {"task_id": admission.definition.id, "day": now.date(), "cap": cap}
            )
            taken = cursor.fetchone()
        if taken is None:
            midnight = datetime.combine(now.date() + timedelta(days=1), time(), now.tzinfo)
            raise QuotaExceeded(
                f"task {admission.definition.id!r} reached its quota of {cap} runs today "
                f"(UTC); it resets at {midnight.isoformat()}",
                retry_after=midnight - now,
            )

    def abandoned(self, admission: Admission) -> None:
        # The unit goes back explicitly rather than through a savepoint around admission:
        # savepoints cost start_run two round trips on every start. A transaction already
        # doomed to roll back gives it back by itself (and would refuse the UPDATE).
        if connection.needs_rollback:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                _GIVE_BACK, {"task_id": admission.definition.id, "day": self.clock.now().date()}
            )

    def finished(self, outcome: Outcome) -> None:
        if not outcome.final or outcome.state not in (RunState.COMPLETED, RunState.FAILED):
            return
        with connection.cursor() as cursor:
            cursor.execute(
                _COUNT_END,
                {
                    "task_id": outcome.definition.id,
                    "day": self.clock.now().date(),
                    "completed": int(outcome.state == RunState.COMPLETED),
                    "failed": int(outcome.state == RunState.FAILED),
                },
            )
