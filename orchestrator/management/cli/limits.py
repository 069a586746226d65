"""`limits`: every named limit and every task's keyed concurrency, a line per key in use, as
`GET /limits` answers them (`api.limit_usage`)."""

from __future__ import annotations

from argparse import ArgumentParser, _SubParsersAction
from typing import Any

from orchestrator.api import limit_usage
from orchestrator.api.access import Access
from orchestrator.management.cli.acting import Session
from orchestrator.management.cli.exits import OK

HEADERS = (
    "NAME", "KIND", "RATE", "PLACES", "TASKS", "KEY", "IN USE", "WAITING", "RATE USED", "TURN"
)  # fmt: skip


def register(commands: _SubParsersAction[ArgumentParser], common: ArgumentParser) -> None:
    found = commands.add_parser("limits", parents=[common], help="limits and their use now")
    found.set_defaults(handler=list_limits, needs=Access.VIEW)


def list_limits(session: Session, options: dict[str, Any]) -> int:
    found = limit_usage.list_limits(session.request)
    rows: list[tuple[object, ...]] = []
    for limit in found:
        declared = (limit.name, limit.kind, limit.rate, limit.concurrency, ",".join(limit.tasks))
        if not limit.keys:
            rows.append((*declared, None, None, None, None, None))
        for key in limit.keys:
            use = (key.key, key.in_use, key.waiting, key.rate_used, key.turn)
            rows.append((*declared, *use))
    session.out.emit(found, HEADERS, rows)
    return OK
