"""`pause NAME --reason WHY [--refuse-starts]` and `resume NAME`: the API's pause operations
(`api.pauses`) on a task or a resource class. A resource class's name (`io`, `cpu`, ...) names
the class; any other name a task."""

from __future__ import annotations

from argparse import ArgumentParser, _SubParsersAction
from typing import Any

from orchestrator.api import pauses as api
from orchestrator.api.access import Access
from orchestrator.management.cli.acting import Session
from orchestrator.management.cli.exits import OK, api_errors
from orchestrator.models import PauseScope
from tasks.resources import RESOURCE_CLASSES

HEADERS = ("SCOPE", "NAME", "REFUSE STARTS", "PAUSED BY", "PAUSED AT", "REASON", "RELEASED")


def register(commands: _SubParsersAction[ArgumentParser], common: ArgumentParser) -> None:
    pause = commands.add_parser("pause", parents=[common], help="pause a task or a class")
    pause.add_argument("name", metavar="TASK|CLASS")
    pause.add_argument("--reason", required=True, help="why, shown to operators beside it")
    pause.add_argument(
        "--refuse-starts",
        action="store_true",
        help="refuse new starts while paused (else they wait, pending)",
    )
    pause.set_defaults(handler=pause_one, needs=Access.OPERATE)

    resume = commands.add_parser(
        "resume", parents=[common], help="end a pause; its held runs are published again"
    )
    resume.add_argument("name", metavar="TASK|CLASS")
    resume.set_defaults(handler=resume_one, needs=Access.OPERATE)


def _scope(name: str) -> PauseScope:
    return PauseScope.CLASS if name in RESOURCE_CLASSES else PauseScope.TASK


def pause_one(session: Session, options: dict[str, Any]) -> int:
    name, refuse = options["name"], options["refuse_starts"]
    scope = _scope(name)
    pause = api.pause_class if scope == PauseScope.CLASS else api.pause_task
    with api_errors():
        body = api.PauseIn(reason=options["reason"], refuse_starts=refuse)
        done = pause(session.request, name, body)
    session.audit(f"paused {scope} {name}" + (" (refusing starts)" if refuse else ""))
    _print(session, done)
    return OK


def resume_one(session: Session, options: dict[str, Any]) -> int:
    name = options["name"]
    scope = _scope(name)
    resume = api.resume_class if scope == PauseScope.CLASS else api.resume_task
    with api_errors():
        done = resume(session.request, name)
    session.audit(f"resumed {scope} {name}: {done.released} held runs published again")
    _print(session, done)
    return OK


def _print(session: Session, done: api.PauseOut) -> None:
    row = (
        done.scope,
        done.name,
        done.refuse_starts,
        done.paused_by,
        done.paused_at,
        done.reason,
        done.released,
    )
    session.out.emit(done, HEADERS, [row])
