"""`dead-letters [--kind K] [--task T] [--limit N] [--requeue]`: what stopped being retried, as
`GET /dead-letters` lists it (`api.dead_letters`): a kind at a time, newest first.

`--requeue` (view and operate) requeues every dead letter the list shows, through
`POST /dead-letters/requeue`, a kind at a time: an exhausted run is rerun, a poison entry
replayed, a dead delivery sent again. Each id gets its outcome; the exit is 5 when any was not
requeued (refused, or gone meanwhile). Without `--requeue` nothing is done: the list is the
dry run.
"""

from __future__ import annotations

from argparse import ArgumentParser, _SubParsersAction
from typing import Any

from orchestrator.api import dead_letters as api
from orchestrator.api.access import Access
from orchestrator.management.cli.acting import Session
from orchestrator.management.cli.exits import NOT_NOW, OK, api_errors

LISTED = ("KIND", "ID", "TASK", "RUN", "AT", "ATTEMPTS", "ERROR", "REQUEUED AS")
ACTED = ("KIND", "ID", "OUTCOME", "RUN", "DETAIL")
DONE = ("requeued", "replayed")


def register(commands: _SubParsersAction[ArgumentParser], common: ArgumentParser) -> None:
    found = commands.add_parser(
        "dead-letters", parents=[common], help="what stopped being retried; --requeue it"
    )
    found.add_argument("--kind", choices=[kind.value for kind in api.Kind])
    found.add_argument("--task", help="those of one task's runs")
    found.add_argument("--limit", type=int, default=50, help=f"at most {api.MAX_PAGE}")
    found.add_argument(
        "--requeue", action="store_true", help="requeue each one listed (needs operate too)"
    )
    found.set_defaults(handler=dead_letters, needs=Access.VIEW)


def dead_letters(session: Session, options: dict[str, Any]) -> int:
    if options["requeue"]:
        session.require(Access.OPERATE)
    with api_errors():
        filters = api.DeadLetterFilters(
            kind=options["kind"], task=options["task"], limit=options["limit"]
        )
        page = api.list_dead_letters(session.request, filters)
    if options["requeue"]:
        return _requeue(session, page.items)
    rows = [
        (i.kind, i.id, i.task, i.run_id, i.at, i.attempts, i.error[:80], " ".join(i.requeued_as))
        for i in page.items
    ]
    session.out.emit(page, LISTED, rows)
    if page.next_cursor and not session.out.json:
        session.out.note(f"more than {options['limit']} listed: raise --limit, or narrow by --kind")
    return OK


def _requeue(session: Session, letters: list[api.DeadLetterOut]) -> int:
    outcomes: list[tuple[api.Kind, api.Outcome]] = []
    for kind in api.Kind:
        ids = [letter.id for letter in letters if letter.kind == kind]
        if not ids:
            continue
        with api_errors():
            done = api.requeue(session.request, api.RequeueIn(kind=kind, ids=ids))
        for outcome in done.results:
            if outcome.outcome in DONE:
                session.audit(f"{outcome.outcome} dead letter {outcome.id}: {outcome.detail}")
            outcomes.append((kind, outcome))
    results = api.Outcomes(results=[outcome for _, outcome in outcomes])
    rows = [(kind, o.id, o.outcome, o.run_id, o.detail) for kind, o in outcomes]
    session.out.emit(results, ACTED, rows)
    return OK if all(o.outcome in DONE for _, o in outcomes) else NOT_NOW
