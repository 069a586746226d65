"""Names shared by the beat rows, the worker supervisor and the dispatch task (no Django)."""

from __future__ import annotations

# The Celery task every synced PeriodicTask row calls, with args [task_id].
DISPATCH_TASK = "lumastra.schedule.dispatch"
# Its queue: every pool of the worker role consumes it (lumastra.workers), so a fire is not
# stuck behind one class's long runs.
SCHEDULER_QUEUE = "task.scheduler"
# SET lock:scheduler:<taskId>:<bucket> NX EX 30: one replica fires each bucket.
BUCKET_LOCK_TTL_S = 30


def state_key(task_id: str, row_key: str = "") -> str:
    """The `scheduler_state` key: the task id for a static schedule, `<taskId>:<rowKey>` for
    one row of a dynamic schedule."""
    return f"{task_id}:{row_key}" if row_key else task_id


def bucket_label(slot: int, row_key: str = "") -> str:
    """The `<bucket>` of the lock key: the slot's start (epoch seconds), per row if dynamic."""
    return f"{row_key}@{slot}" if row_key else str(slot)
