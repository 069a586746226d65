"""Handing back a stopping worker's runs: what a graceful deploy does once its grace is over.

The worker role (`lumastra.workers`) stops on SIGTERM or SIGINT: its Celery workers stop
taking messages at once (Celery's warm shutdown) and their running runs get
LUMASTRA_SHUTDOWN_GRACE_S to finish. Those still running then are handed back here, on the
same host, instead of being failed or left to the reconciler:

1. The pool processes still alive are killed (SIGKILL), and `hand_back` waits until they are
   gone: a run must not be given to another worker while its handler still runs here. Each is
   marked first (`runs.stopping`), so its Celery worker does not log the kill as a crash.
2. Every active run owned by one of them goes back to `pending` for its next attempt, its
   message published again (`runs.put_back`: fenced by the dead claim, the attempt counted,
   the task's backoff, the error kind `worker_lost` with "handed back" in its message); a run
   on its last attempt, or of a task with `retry_on_worker_loss=False`, fails instead, as any
   run whose worker died.
3. Every running pipeline stage one of them had claimed goes back to `waiting` for its next
   attempt (or fails, with its run, when it has none left), as a stage whose claimer died on
   this host does when its message comes back (`runs.stage_attempts.put_back_dead_stage`).

The log says it once per run: one line naming each run put back (`runs.put_back`), failed, or
whose stage was put back; then one line of totals, and no traceback.

The messages those processes held are returned by Celery itself (`reject_on_worker_lost`)
and those still reserved by the stopping worker by kombu when it closes its channel; a copy
that comes back after the run was handed back finds it pending (or claimed anew) and is
dropped or waits its turn, as any duplicate.

Not guaranteed: a worker host that loses power or is SIGKILLed whole runs none of this; its
runs are put back by the reconciler once their heartbeats are older than the orphan threshold
(`recovery.orphans`). A SIGTERM to the role's whole process group (honcho under `make run`,
systemd's default KillMode=control-group) also reaches the pool processes, which Celery leaves
to SIGTERM's default: they end at once, with no grace and no hand back, and their runs are
put back as any dead pool process's when their messages come back (Celery reports those as
lost workers, with a traceback). KillMode=mixed signals the role's own process only.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass
from functools import reduce
from operator import or_
from pathlib import Path

from django.db.models import Q

from orchestrator.cluster.instance import is_dead_here
from orchestrator.models import TaskHistory
from orchestrator.runs import put_back, stage_attempts, stopping
from orchestrator.states import RunState, StageState
from tasks import registry

log = logging.getLogger(__name__)

# How long the killed processes have to be reaped by their parent before runs are looked at.
GONE_WITHIN_S = 10.0


@dataclass
class HandbackReport:
    killed: int = 0  # pool processes killed
    put_back: int = 0  # runs put back to pending
    failed: int = 0  # runs with no attempt left, failed `worker_lost`
    stages: int = 0  # pipeline stages put back (or failed with their run)
    errors: int = 0  # logged with the run id


def hand_back(
    pids: Collection[int], *, grace_s: float, marks: Path | None = None
) -> HandbackReport:
    """Kill the pool processes `pids` of this host and hand back the runs and stages they
    were running (see the module docstring); each process is marked in `marks` first."""
    report = HandbackReport()
    pids = sorted(set(pids))
    if not pids:
        return report
    for pid in pids:
        try:
            if marks is not None:
                stopping.mark(marks, pid)
            os.kill(pid, signal.SIGKILL)
            report.killed += 1
        except ProcessLookupError:
            continue
    host = socket.gethostname()
    owners = [f"{host}:{pid}:" for pid in pids]
    deadline = time.monotonic() + GONE_WITHIN_S
    while not all(_gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            log.error("pool processes %s not gone after SIGKILL; their runs are left", pids)
            return report
        time.sleep(0.05)
    why = f"its worker shut down; handed back after the {grace_s:.0f}s grace"
    _hand_back_runs(owners, why, report)
    _hand_back_stages(owners, report)
    log.warning(
        "handed back: %s pool processes killed, %s runs put back, %s failed, %s stages",
        report.killed,
        report.put_back,
        report.failed,
        report.stages,
    )
    return report


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        return is_dead_here(f"{socket.gethostname()}:{pid}:")


def _owned_by(owners: list[str]) -> Q:
    return reduce(or_, (Q(owner_instance_id__startswith=owner) for owner in owners))


def _hand_back_runs(owners: list[str], why: str, report: HandbackReport) -> None:
    rows = TaskHistory.objects.filter(_owned_by(owners), state=RunState.ACTIVE, stages={})
    found = rows.values_list(
        "id", "task_id", "owner_instance_id", "attempts", "identity", "priority"
    )
    definitions = registry.get()
    for run_id, task_id, owner, attempts, identity, priority in found:
        definition = definitions.get(task_id)
        if definition is None:
            log.warning(
                "run %s: task %r is not registered; left to the reconciler", run_id, task_id
            )
            continue
        lost = put_back.Lost(run_id, owner, attempts, identity, priority)
        try:
            ended = put_back.put_back_or_fail(definition, lost, f"{why} (worker {owner})")
        except Exception:
            report.errors += 1
            log.exception("run %s: not handed back; the reconciler will put it back", run_id)
            continue
        if ended == RunState.PENDING:
            report.put_back += 1  # `put_back` logged it
        elif ended is not None:
            report.failed += 1
            log.warning("run %s: %s (worker %s); %s, not retried", run_id, why, owner, ended)


def _hand_back_stages(owners: list[str], report: HandbackReport) -> None:
    running = TaskHistory.objects.filter(state=RunState.ACTIVE).exclude(stages={})
    definitions = registry.get()
    for run_id, task_id, stages, records in running.values_list("id", "task_id", "stages", "steps"):
        definition = definitions.get(task_id)
        if definition is None:
            continue
        for name, state in stages.items():
            claimer = str((records.get(name) or {}).get("owner", ""))
            if state != StageState.ACTIVE or not claimer.startswith(tuple(owners)):
                continue
            try:
                stage_attempts.put_back_dead_stage(definition, run_id, name)
                report.stages += 1
                log.warning("run %s: stage %s handed back (worker %s)", run_id, name, claimer)
            except Exception:
                report.errors += 1
                log.exception("run %s: stage %s not handed back", run_id, name)
