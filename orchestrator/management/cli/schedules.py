"""`schedules`: every static schedule and every dynamic schedule's rows, with next and last
fire, as `GET /schedules` answers them (`api.schedules`)."""

from __future__ import annotations

from argparse import ArgumentParser, _SubParsersAction
from typing import Any

from orchestrator.api import schedules as api
from orchestrator.api.access import Access
from orchestrator.management.cli.acting import Session
from orchestrator.management.cli.exits import OK

HEADERS = ("KIND", "NAME", "ENABLED", "CADENCE", "NEXT FIRE", "LAST FIRE", "LAST RUN", "ERROR")


def register(commands: _SubParsersAction[ArgumentParser], common: ArgumentParser) -> None:
    found = commands.add_parser("schedules", parents=[common], help="every schedule")
    found.set_defaults(handler=list_schedules, needs=Access.VIEW)


def list_schedules(session: Session, options: dict[str, Any]) -> int:
    found = api.list_schedules(session.request)
    rows: list[tuple[object, ...]] = [
        ("static", s.name, s.enabled, s.cadence, s.next_fire_at, *_last(s.last_fire))
        for s in found.static
    ]
    for schedule in found.dynamic:
        if schedule.error:
            rows.append(("dynamic", schedule.task, None, None, None, None, None, schedule.error))
        for r in schedule.rows:
            every = f"every {r.interval_s:g}s" if r.interval_s is not None else None
            cadence = r.override.cadence if r.override else every
            name = f"{schedule.task}:{r.row}"
            rows.append(("dynamic", name, r.enabled, cadence, r.next_fire_at, *_last(r.last_fire)))
    session.out.emit(found, HEADERS, rows)
    return OK


def _last(last: api.LastFireOut) -> tuple[object, object, object]:
    return last.at, last.run_id, last.error
