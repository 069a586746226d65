"""`watch RUN [--interval S] [--timeout S]`: follow one run in the terminal, as the console's
run page does, until it ends: its state as it moves, its progress as the handler reports it
(the live hash, `stores.live`) and its log lines as they are written (the live log,
`runs.context.read_log`), polled every `--interval` seconds (0.5).

It exits 0 when the run completed, 1 when it failed or was cancelled, or when `--timeout`
seconds (0, the default: none) passed first; Ctrl-C stops watching (130), never the run. With
`--json` each event is one JSON document on a line of its own (`state`, `progress`, `log` with
the fields of the API's log lines, `end`), so a script can read them as they come.

Not guaranteed: lines trimmed from the live log (past LUMASTRA_LOG_CAP) between two polls are
not printed; a run whose live log has expired (24 h) shows only its end.
"""

from __future__ import annotations

import json
import time
from argparse import ArgumentParser, _SubParsersAction
from typing import Any

from orchestrator.api.access import Access
from orchestrator.api.runs import progress_report
from orchestrator.management.cli import arguments
from orchestrator.management.cli.acting import Session
from orchestrator.management.cli.exits import (
    INTERRUPTED,
    NOT_COMPLETED,
    NOT_FOUND,
    OK,
    Failure,
)
from orchestrator.management.cli.runs import progress_text
from orchestrator.models import TaskHistory
from orchestrator.runs import context
from orchestrator.states import TERMINAL_RUN_STATES, RunState
from orchestrator.stores import live

_ENDED = {state.value for state in TERMINAL_RUN_STATES}


def register(commands: _SubParsersAction[ArgumentParser], common: ArgumentParser) -> None:
    found = commands.add_parser(
        "watch", parents=[common], help="follow a run's progress and log until it ends"
    )
    found.add_argument("run", type=arguments.run_id, metavar="RUN")
    found.add_argument("--interval", type=float, default=0.5, help="seconds between looks")
    found.add_argument(
        "--timeout", type=float, default=0.0, help="give up after this many seconds (0: never)"
    )
    found.set_defaults(handler=watch, needs=Access.VIEW)


def watch(session: Session, options: dict[str, Any]) -> int:
    run = _Follower(session, options["run"])
    timeout = options["timeout"]
    deadline = time.monotonic() + timeout if timeout > 0 else None
    try:
        while (ended := run.look()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                session.out.note(f"{run.run_id} is still {run.state} after {timeout:g} s")
                return NOT_COMPLETED
            time.sleep(max(options["interval"], 0.05))  # 0 or less would spin
    except KeyboardInterrupt:
        session.out.note(f"stopped watching; {run.run_id} goes on")
        return INTERRUPTED
    return OK if ended == RunState.COMPLETED else NOT_COMPLETED


class _Follower:
    """What was shown of one run so far, and one look at what changed since."""

    def __init__(self, session: Session, run_id: str) -> None:
        self.out = session.out
        self.run_id = run_id
        self.state = ""
        self.progress = ""
        self.seq = 0
        if _durable_state(run_id) is None:
            raise Failure(NOT_FOUND, f"no run {run_id!r}")

    def look(self) -> str | None:
        """Print what changed; the run's terminal state once it has ended, else None."""
        # Postgres decides the end (it is written first); the live hash is ahead before it.
        durable = _durable_state(self.run_id) or ""
        found = live.read(self.run_id)
        state = durable if durable in _ENDED else found.get("state") or durable
        if state != self.state:
            self.state = state
            if state not in _ENDED:
                self._event({"event": "state", "state": state}, f"-- {state}")
        progress = found.get("progress") or ""
        if progress and progress != self.progress:
            self.progress = progress
            self._progress(progress)
        # Read after the end was: a handler's last lines are sent before its end is written.
        self._lines()
        if durable not in _ENDED:
            return None
        error = TaskHistory.objects.filter(id=self.run_id).values_list("error", flat=True).first()
        said = f" ({error.get('kind')}: {error.get('message')})" if error else ""
        self._event({"event": "end", "state": durable, "error": error}, f"-- {durable}{said}")
        return durable

    def _lines(self) -> None:
        for line in context.read_log(self.run_id, self.seq):
            entry = line.entry
            stage = f"[{entry['stage']}] " if entry.get("stage") else ""
            text = f"{str(entry.get('ts', ''))[11:19]} {entry.get('level', ''):7} {stage}"
            self._event({"event": "log", "seq": line.seq, **entry}, text + str(entry.get("msg")))
            self.seq = line.seq

    def _progress(self, raw: str) -> None:
        report = progress_report(json.loads(raw))
        if report is None:
            return
        text = f"-- progress {progress_text(report)}"
        text += f" (eta {report.eta_s:.0f} s)" if report.eta_s is not None else ""
        self._event({"event": "progress", **report.model_dump()}, text)

    def _event(self, document: dict[str, Any], text: str) -> None:
        if self.out.json:
            self.out.event(document)
        else:
            self.out.line(text)


def _durable_state(run_id: str) -> str | None:
    return TaskHistory.objects.filter(id=run_id).values_list("state", flat=True).first()
