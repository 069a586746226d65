"""Every Valkey key name the system uses (DESIGN §5). No key literal lives anywhere else."""

from __future__ import annotations


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
