"""`runs`, `show RUN`, `cancel RUN [--kill]`, `retry RUN [--fresh]`: the API's run operations
(`api.runs`), called as the acting user, their documents printed as they are answered.

`runs` is `GET /runs`: newest first, a page at a time (`--limit`, `--cursor`; the next cursor
goes to stderr under a table, into the document with --json); `--input KEY=VALUE` is the API's
`input.KEY=VALUE`, `--tag` its `tag`. A `--task` that is neither registered nor the task of
any run is not found rather than an empty list.
"""

from __future__ import annotations

from argparse import ArgumentParser, _SubParsersAction
from typing import Any
from urllib.parse import urlencode

from django.http import QueryDict

from orchestrator.api import runs as api
from orchestrator.api.access import Access
from orchestrator.api.run_search import INPUT_PREFIX
from orchestrator.management.cli import arguments
from orchestrator.management.cli.acting import Session
from orchestrator.management.cli.exits import NOT_FOUND, OK, Failure, api_errors
from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from tasks import registry


def register(commands: _SubParsersAction[ArgumentParser], common: ArgumentParser) -> None:
    found = commands.add_parser("runs", parents=[common], help="list runs, newest first")
    found.add_argument("--task", help="a task's runs")
    found.add_argument("--state", choices=[state.value for state in RunState])
    found.add_argument(
        "--since", type=arguments.moment, help="created at or after: 15m, 2h, 7d or ISO 8601"
    )
    found.add_argument(
        "--input",
        type=arguments.pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a top-level input field equals VALUE (as JSON or as text); repeatable",
    )
    found.add_argument("--tag", action="append", default=[], help="runs with every one given")
    found.add_argument("--limit", type=int, default=50, help=f"at most {api.MAX_PAGE}")
    found.add_argument("--cursor", help="the next cursor a previous page gave")
    found.set_defaults(handler=list_runs, needs=Access.VIEW)

    show = commands.add_parser("show", parents=[common], help="one run, as GET /runs/{id}")
    show.add_argument("run", type=arguments.run_id, metavar="RUN")
    show.set_defaults(handler=show_run, needs=Access.VIEW)

    cancel = commands.add_parser("cancel", parents=[common], help="cancel a run")
    cancel.add_argument("run", type=arguments.run_id, metavar="RUN")
    cancel.add_argument("--kill", action="store_true", help="kill now: do not wait for it")
    cancel.set_defaults(handler=cancel_run, needs=Access.OPERATE)

    retry = commands.add_parser("retry", parents=[common], help="retry a failed or cancelled run")
    retry.add_argument("run", type=arguments.run_id, metavar="RUN")
    retry.add_argument(
        "--fresh", action="store_true", help="a pipeline runs every stage again (no resume)"
    )
    retry.set_defaults(handler=retry_run, needs=Access.OPERATE)


def list_runs(session: Session, options: dict[str, Any]) -> int:
    task = options["task"]
    known = task is None or task in registry.get()
    if not known and not TaskHistory.objects.filter(task_id=task).exists():
        raise Failure(NOT_FOUND, f"no task {task!r}: none is registered and no run has it")
    # Where the API's list reads `input.KEY=VALUE` from: the query string.
    pairs = [(f"{INPUT_PREFIX}{key}", value) for key, value in options["input"]]
    session.request.GET = QueryDict(urlencode(pairs))
    with api_errors():
        filters = api.RunFilters(
            task=task,
            parent=None,
            state=options["state"],
            # As a query string carries it: the API's field reads RFC 3339 text.
            since=options["since"].isoformat() if options["since"] else None,
            tag=options["tag"],
            limit=options["limit"],
            cursor=options["cursor"],
        )
        page = api.list_runs(session.request, filters)
    rows = [
        (
            r.run_id,
            r.task,
            r.state,
            r.priority,
            progress_text(r.progress),
            r.created_at,
            r.finished_at,
        )
        for r in page.items
    ]
    headers = ("RUN", "TASK", "STATE", "PRIORITY", "PROGRESS", "CREATED", "FINISHED")
    session.out.emit(page, headers, rows)
    if page.next_cursor and not session.out.json:
        session.out.note(f"more: --cursor {page.next_cursor}")
    return OK


def show_run(session: Session, options: dict[str, Any]) -> int:
    with api_errors():
        run = api.get_run(session.request, options["run"])
    error = run.error or {}
    rows = [
        ("run", run.run_id),
        ("task", run.task),
        ("state", run.state),
        ("held", run.held.says if run.held else None),
        ("priority", run.priority),
        ("trigger", run.trigger),
        ("tags", " ".join(run.tags)),
        ("created", run.created_at),
        ("started", run.started_at),
        ("finished", run.finished_at),
        ("duration_s", run.duration_s),
        ("attempts", run.attempts),
        ("progress", progress_text(run.progress)),
        ("stages", run.stages),
        ("error", f"{error.get('kind')}: {error.get('message')}" if error else None),
        ("input", run.input),
        ("result", run.result),
        ("children", "; ".join(batch.says for batch in run.children)),
    ]
    session.out.emit(run, None, rows)
    return OK


def cancel_run(session: Session, options: dict[str, Any]) -> int:
    run_id, kill = options["run"], options["kill"]
    with api_errors():
        done = api.cancel_run(session.request, run_id, api.CancelIn(kill=kill))
    session.audit(f"{'killed' if kill else 'cancelled'} run {run_id} (now {done.state})", run_id)
    session.out.emit(done, ("RUN", "STATE"), [(done.run_id, done.state)])
    return OK


def retry_run(session: Session, options: dict[str, Any]) -> int:
    run_id = options["run"]
    mode = api.RetryMode.FRESH if options["fresh"] else None
    with api_errors():
        started = api.retry(session.request, run_id, api.RetryIn(mode=mode)).value
    session.audit(f"retried run {run_id} as {started.run_id}", run_id)
    headers = ("RUN", "NEW RUN", "STATE", "OUTCOME")
    session.out.emit(started, headers, [(run_id, started.run_id, started.state, started.outcome)])
    return OK


def progress_text(progress: api.Progress | None) -> str | None:
    """Done (of total) and the item, as a table cell or `watch` shows it."""
    if progress is None:
        return None
    done = f"{progress.done:g}" + (f"/{progress.total:g}" if progress.total is not None else "")
    return f"{done} {progress.item}" if progress.item else done
