"""Every Valkey key name the system uses (DESIGN §5). No key literal lives anywhere else.

The broker's list names are kombu's, reproduced here so depth checks and shedding can read
them: kombu's Redis transport keeps each priority of a queue in its own list.
"""

from __future__ import annotations

# kombu's Redis transport: the separator of priority sub-queues, and our priority steps.
BROKER_PRIORITY_SEPARATOR = "\x06\x16"
BROKER_PRIORITY_STEPS = (1, 2, 3, 5, 7)


def broker_queue(queue: str, priority: int) -> str:
    """The broker list holding `queue`'s messages of one priority step."""
    return f"{queue}{BROKER_PRIORITY_SEPARATOR}{priority}"


def run_active(run_id: str) -> str:
    return f"task:run:active:{run_id}"


def run_terminal(run_id: str) -> str:
    return f"task:run:terminal:{run_id}"


def identity(task_id: str, formula: str) -> str:
    return f"task:identity:{task_id}:{formula}"


def run_log(run_id: str) -> str:
    return f"task:log:{run_id}"


def cancel_channel(run_id: str) -> str:
    return f"task:cancel:{run_id}"


def orchestrator_lock(resource_class: str) -> str:
    return f"lock:orch:{resource_class}"


def scheduler_lock(task_id: str, bucket: str) -> str:
    return f"lock:scheduler:{task_id}:{bucket}"


def cluster_node(instance_id: str) -> str:
    return f"cluster:node:{instance_id}"


def refusals(task_id: str, day: str) -> str:
    """Hash of refusal code → count for one task and UTC day (YYYY-MM-DD)."""
    return f"task:refusals:{task_id}:{day}"


def circuit(task_id: str) -> str:
    """Hash of one task's circuit breaker state (orchestrator/circuit.py); no TTL."""
    return f"task:circuit:{task_id}"


def concurrency_holders(task_id: str) -> str:
    """Sorted set of `<runId>|<owner>` → lease expiry (ms, Valkey's clock): runs holding a slot."""
    return f"task:concurrency:{task_id}:holders"


def concurrency_waiters(task_id: str) -> str:
    """Sorted set of run id → when it first found no slot (ms): the waiting line, oldest first."""
    return f"task:concurrency:{task_id}:waiters"


def concurrency_postponed(task_id: str) -> str:
    """Hash of run id → `<postponements>:<last seen ms>` for the runs in the waiting line."""
    return f"task:concurrency:{task_id}:postponed"


def rate_window(task_id: str) -> str:
    """Sorted set of `<runId>|<owner>` → admission time (ms, Valkey's clock) within the window."""
    return f"task:ratelimit:{task_id}"
