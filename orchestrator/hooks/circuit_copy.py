"""A task's circuit, copied to Postgres (`task_circuit_state`) after each change and read back
into Valkey when its hash is missing (Valkey restarted or flushed): `orchestrator.hooks.circuit`
says what is and is not guaranteed."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, TypedDict

from django.db import connection

from orchestrator.clock import Clock
from orchestrator.models import CircuitState, TaskCircuitState
from orchestrator.stores import keys, queries, valkey

log = logging.getLogger(__name__)


class CircuitHash(TypedDict, total=False):
    version: str  # incremented by every change; orders the Postgres copy's upserts
    state: str  # closed | open | half_open (stored as open until a probe is admitted)
    consecutive: str
    reopen_count: str  # times it opened in a row without closing
    opened_at: str  # ms since the epoch, "" when closed (as every time field)
    half_open_at: str
    forced_until: str
    forced_by: str
    recent: str  # "<ms>:<runId>,..." the newest counted failures inside the window
    probe_run: str
    probe_until: str
    updated_at: str


def restore(task_id: str, clock: Clock) -> None:
    row = TaskCircuitState.objects.filter(task_id=task_id).first()
    # No row: the task has never changed its circuit; an unsaved row holds the closed defaults.
    c = from_row(row or TaskCircuitState(task_id=task_id, updated_at=clock.now()))
    args = [
        c["version"],
        c["state"],
        c["consecutive"],
        c["reopen_count"],
        c["opened_at"],
        c["half_open_at"],
        c["forced_until"],
        c["forced_by"],
        c["recent"],
        c["updated_at"],
    ]
    if valkey.script("circuit_restore", [keys.circuit(task_id)], args) and row is not None:
        log.warning("task %s: circuit hash rebuilt from Postgres (%s)", task_id, row.state)


def persist(task_id: str, circuit: CircuitHash) -> None:
    recent = [{"at": at, "run": run} for at, run in recent_failures(circuit.get("recent", ""))]
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CIRCUIT_PERSIST,
            {
                "task_id": task_id,
                "state": circuit.get("state", CircuitState.CLOSED.value),
                "consecutive": int(circuit.get("consecutive") or 0),
                "reopen_count": int(circuit.get("reopen_count") or 0),
                "opened_at": moment_of(circuit.get("opened_at")),
                "half_open_at": moment_of(circuit.get("half_open_at")),
                "forced_until": moment_of(circuit.get("forced_until")),
                "forced_by": circuit.get("forced_by", ""),
                "recent": json.dumps(recent),
                "version": int(circuit.get("version") or 0),
                "updated_at": moment_of(circuit.get("updated_at")),
            },
        )


def from_row(row: TaskCircuitState) -> CircuitHash:
    def ms(moment: datetime | None) -> str:
        return "" if moment is None else str(valkey.to_ms(moment))

    recent: list[dict[str, Any]] = row.recent_failures
    return {
        "version": str(row.version),
        "state": row.state,
        "consecutive": str(row.consecutive_failures),
        "reopen_count": str(row.reopen_count),
        "opened_at": ms(row.opened_at),
        "half_open_at": ms(row.half_open_at),
        "forced_until": ms(row.forced_until),
        "forced_by": row.forced_by,
        "recent": ",".join(f"{entry['at']}:{entry['run']}" for entry in recent),
        "updated_at": ms(row.updated_at),
    }


def recent_failures(raw: str) -> list[tuple[int, str]]:
    entries = []
    for entry in raw.split(","):
        if entry:
            at, _, run = entry.partition(":")
            entries.append((int(at), run))
    return entries


def moment_of(ms: str | None) -> datetime | None:
    return valkey.from_ms(ms) if ms else None
