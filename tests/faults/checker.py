"""The fault battery's checker: what must hold after every scenario, once the reconciler settled.

- **one terminal state**: every run of the scenario is completed, failed or cancelled in
  Postgres, and its audit trail (`task_history_audit`, written by Postgres triggers) enters
  a terminal state exactly once and ends in the row's state;
- **none lost**: every run id `start_run` returned has a row;
- **none stuck**: no run is still live when the check runs (the driver waits at most the
  scenario's bound, derived from the thresholds, before it calls the check);
- **no illegal transition**: every audited (from, to) pair is allowed by
  `orchestrator.states.RUN_TRANSITIONS`; a row is born `pending`, or `cancelled` when a
  backpressure drop recorded it (`error.kind == "dropped"`);
- **at most once per claim**: the handler of a run was entered at most as many times as the
  run was claimed (`attempts`), and never twice under one claim owner (side effects recorded
  by the fault tasks, see `tests/support/task_defs.py`); the same for each pipeline stage,
  against the stage's attempts (its step record);
- **never twice at the same time**: no handler (or stage) was entered while another process
  was still inside it for the same run (the fault tasks' entry lock, a `flock` the kernel
  releases when its holder dies); an entry beside a process the scenario had SIGSTOPped is
  reported apart (`frozen_pids`: that process executes nothing while stopped);
- **no stage left open**: an ended pipeline run has no stage still waiting or active.

It also reports what it saw (runs, states, error kinds, recovery time), which the driver
prints and `docs/reliability.md` records, and the runs whose Valkey snapshot disagrees with
Postgres. Those are reported, not failed: Postgres is the truth and Valkey is rebuilt from it,
but today nothing rebuilds a live hash left behind a terminal write (a worker killed between
its Postgres write and its Valkey write); `tests/faults/test_regressions.py` pins that gap.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection

from orchestrator.states import RUN_TRANSITIONS, TERMINAL_RUN_STATES, RunState
from orchestrator.stores import live

# What a row may be born as: pending, or cancelled for a start backpressure dropped.
BORN = {RunState.PENDING.value, RunState.CANCELLED.value}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def illegal_pairs(pairs: Iterable[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
    """The audited (from, to) pairs `RUN_TRANSITIONS` does not allow; from None is an INSERT."""
    known = {s.value for s in RunState}
    bad = []
    for source, target in pairs:
        if target not in known or (source is not None and source not in known):
            bad.append((source, target))
        elif source is None:
            if target not in BORN:
                bad.append((source, target))
        elif RunState(target) not in RUN_TRANSITIONS[RunState(source)]:
            bad.append((source, target))
    return bad


@dataclass(frozen=True)
class Execution:
    run: str
    stage: str  # "" for a plain run's handler
    owner: str
    pid: int
    at: float
    overlap_with: int | None = None  # a process still inside the same handler at entry


def read_effects(path: Path) -> list[Execution]:
    """The handler entries the fault tasks appended (a torn last line is skipped)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
            found.append(
                Execution(
                    entry["run"],
                    entry.get("stage", ""),
                    entry["owner"],
                    int(entry["pid"]),
                    entry["at"],
                    entry.get("overlap_with"),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return found


@dataclass
class Report:
    scenario: str
    runs: int = 0  # rows of the scenario in task_history
    started: int = 0  # run ids start_run returned
    refused_starts: int = 0  # starts that raised (nothing recorded; the caller was told)
    states: dict[str, int] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    executions: int = 0
    retried: int = 0  # runs that took more than one attempt
    # Late writes the fences refused (a claim's owner or attempt no longer the run's), from
    # the workers' logs (`Harness.late_writes_refused`).
    late_writes_refused: int = 0
    # The cluster seat's move to another host after a cut of its holder (partition scenarios).
    leader_failover_s: float | None = None
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    illegal: list[str] = field(default_factory=list)
    not_once_terminal: list[str] = field(default_factory=list)
    over_executed: list[str] = field(default_factory=list)
    overlapping: list[str] = field(default_factory=list)
    stages_open: list[str] = field(default_factory=list)
    valkey_disagrees: list[str] = field(default_factory=list)
    recovery_s: float | None = None  # last fault → every run terminal
    duration_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, sort_keys=True)

    def summary(self) -> str:
        kills = sum(self.faults.values())
        recovery = "n/a" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        failover = (
            "" if self.leader_failover_s is None else f", failover {self.leader_failover_s} s"
        )
        return (
            f"{self.scenario}: runs {self.runs} (started {self.started}, refused starts "
            f"{self.refused_starts}), faults {kills} {dict(self.faults)}, lost {len(self.lost)}, "
            f"stuck {len(self.stuck)}, illegal transitions {len(self.illegal)}, "
            f"over-executed {len(self.over_executed)}, "
            f"executed twice at once {len(self.overlapping)}, executions {self.executions}, "
            f"retried {self.retried}, late writes refused {self.late_writes_refused}, "
            f"Valkey behind Postgres {len(self.valkey_disagrees)}, "
            f"states {dict(self.states)}, error kinds {dict(self.error_kinds)}, "
            f"max recovery {recovery}{failover}, took {self.duration_s:.0f} s"
        )


_ROWS = """
SELECT id, state, attempts, error ->> 'kind', stages, steps
  FROM task_history
 WHERE id = ANY(%s) OR created_at >= %s
"""
_AUDIT = """
SELECT run_id, from_state, to_state FROM task_history_audit WHERE run_id = ANY(%s) ORDER BY id
"""


def check(
    report: Report,
    *,
    started: Sequence[str],
    since: Any,
    effects: Sequence[Execution],
    compare_valkey: bool = True,
    frozen_pids: Iterable[int] = (),
) -> Report:
    """Fill `report` with the figures and the problems of the runs started since `since`."""
    with connection.cursor() as cursor:
        cursor.execute(_ROWS, [list(started), since])
        found_rows = cursor.fetchall()
        rows = {r[0]: (r[1], r[2], r[3]) for r in found_rows}
        pipelines = {r[0]: (_json(r[4]), _json(r[5])) for r in found_rows if _json(r[4])}
        cursor.execute(_AUDIT, [list(rows)])
        trails: dict[str, list[tuple[str | None, str]]] = {}
        for run_id, source, target in cursor.fetchall():
            trails.setdefault(run_id, []).append((source, target))

    report.runs = len(rows)
    report.started = len(set(started))
    report.states = dict(Counter(state for state, _, _ in rows.values()))
    report.error_kinds = dict(Counter(kind for _, _, kind in rows.values() if kind))
    report.lost = sorted(set(started) - set(rows))
    terminal = {s.value for s in TERMINAL_RUN_STATES}
    report.stuck = sorted(r for r, (state, _, _) in rows.items() if state not in terminal)
    report.retried = sum(1 for _, attempts, _ in rows.values() if attempts > 1)

    for run_id, (state, _, kind) in rows.items():
        trail = trails.get(run_id, [])
        for source, target in illegal_pairs(trail):
            report.illegal.append(f"{run_id}: {source} → {target}")
        if trail and trail[0] == (None, RunState.CANCELLED.value) and kind != "dropped":
            report.illegal.append(f"{run_id}: born cancelled without being dropped ({kind})")
        for (_, before), (after, _) in itertools.pairwise(trail):
            if before != after:
                report.illegal.append(f"{run_id}: trail jumps from {before} to {after}")
        entered = sum(1 for _, target in trail if target in terminal)
        if state in terminal and (entered != 1 or not trail or trail[-1][1] != state):
            report.not_once_terminal.append(f"{run_id}: {state}, trail {trail}")

    for run_id, (stages, _) in pipelines.items():
        open_ = sorted(name for name, s in stages.items() if s in ("waiting", "active"))
        if rows[run_id][0] in terminal and open_:
            report.stages_open.append(f"{run_id}: {rows[run_id][0]} with stages {open_} open")

    by_stage: dict[tuple[str, str], list[Execution]] = {}
    for execution in effects:
        if execution.stage:
            by_stage.setdefault((execution.run, execution.stage), []).append(execution)
    for (run_id, stage), entries in by_stage.items():
        if run_id not in pipelines:
            continue
        attempts = pipelines[run_id][1].get(stage, {}).get("attempts", 0)
        owners = Counter(e.owner for e in entries)
        if len(entries) > attempts or max(owners.values()) > 1:
            report.over_executed.append(
                f"{run_id} stage {stage}: {len(entries)} executions, {attempts} claims, "
                f"owners {dict(owners)}"
            )

    by_run: dict[str, list[Execution]] = {}
    for execution in effects:
        if not execution.stage:
            by_run.setdefault(execution.run, []).append(execution)
    report.executions = sum(len(v) for r, v in by_run.items() if r in rows) + sum(
        len(v) for (r, _), v in by_stage.items() if r in rows
    )
    for run_id, entries in by_run.items():
        if run_id not in rows:
            continue
        attempts = rows[run_id][1]
        owners = Counter(e.owner for e in entries)
        if len(entries) > attempts or max(owners.values()) > 1:
            report.over_executed.append(
                f"{run_id}: {len(entries)} executions, {attempts} claims, owners {dict(owners)}"
            )

    frozen = set(frozen_pids)
    beside_frozen = 0
    for execution in effects:
        if execution.overlap_with is None or execution.run not in rows:
            continue
        if execution.overlap_with in frozen:
            beside_frozen += 1
            continue
        where = f" stage {execution.stage}" if execution.stage else ""
        report.overlapping.append(
            f"{execution.run}{where}: entered by pid {execution.pid} ({execution.owner}) while "
            f"pid {execution.overlap_with} was still inside it"
        )
    if frozen:
        report.notes["entries while a SIGSTOPped claimer was frozen"] = beside_frozen

    if compare_valkey:
        for run_id, (state, _, _) in rows.items():
            seen = live.read(run_id).get("state")
            # A snapshot lost with Valkey is not a disagreement: Postgres is the truth.
            if seen is not None and seen != state:
                report.valkey_disagrees.append(f"{run_id}: postgres {state}, valkey {seen}")

    for name, found in (
        ("lost", report.lost),
        ("stuck", report.stuck),
        ("illegal transitions", report.illegal),
        ("not exactly one terminal state", report.not_once_terminal),
        ("executed more than once per claim", report.over_executed),
        ("executed twice at the same time", report.overlapping),
        ("pipeline runs ended with stages open", report.stages_open),
    ):
        if found:
            report.problems.append(f"{len(found)} {name}: {found[:5]}")
    return report
