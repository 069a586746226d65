"""Cancel or retry every run a filter finds (`runs.search`): the API's `POST /runs:cancel` and
`/runs:retry`, the console's actions on a filtered list, the CLI.

Each run goes through the one-run path (`cancel.request_cancel`, `rerun.rerun`), so a bulk
action does exactly what as many single actions would, and each run's outcome is reported.
A call acts on at most BULK_MAX runs, oldest first; `more` says the filter found others (call
again: the ones acted on no longer match, being cancelled or retried). A dry run counts only.

A retry by filter leaves out the runs an operator retry already names, so the same call made
again retries the rest, never a run twice.

A run's own refusal (it ended meanwhile, its task is gone, admission refused its retry) is its
outcome, `refused`; a store failing one run's action (Valkey away) is `error`, logged, and the
next runs are still tried. A run that changes state between the filter's read and its action
is refused, never acted on twice: a retry by filter holds the original's row while it checks
that no retry names it (`rerun(..., once=True)`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.db.models import Exists, OuterRef, QuerySet

from orchestrator.hooks.base import Refused
from orchestrator.models import TaskHistory
from orchestrator.runs import search
from orchestrator.runs.cancel import (
    CANCELLABLE,
    KILLABLE,
    NotCancellable,
    UnknownRun,
    request_cancel,
)
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.rerun import RETRYABLE, rerun, retries_of
from tasks.registry import UnknownTaskError

log = logging.getLogger(__name__)

BULK_MAX = 10_000


@dataclass(frozen=True)
class Acted:
    run_id: str
    outcome: str  # cancelled, cancelling, retried, refused, error
    detail: str = ""
    new_run_id: str | None = None  # a retry's run


@dataclass(frozen=True)
class Bulk:
    matched: int  # the runs the filter finds that the action applies to
    items: tuple[Acted, ...]  # none on a dry run
    more: bool  # more matched than one call acts on


def cancel(
    found: search.RunFilter,
    *,
    actor: str,
    kill: bool = False,
    dry_run: bool = False,
    runs: QuerySet[TaskHistory] | None = None,
) -> Bulk:
    """Cancel (with `kill`: kill now) the live runs `found` names, among `runs` when given
    (the console's chosen runs)."""

    def act(run_id: str) -> Acted:
        state = request_cancel(run_id, actor=actor, kill=kill)
        return Acted(run_id, state.value)

    chosen = search.matching(found, runs)
    return _each(chosen.filter(state__in=KILLABLE if kill else CANCELLABLE), act, dry_run)


def retry(
    found: search.RunFilter,
    *,
    actor: str,
    fresh: bool = False,
    dry_run: bool = False,
    runs: QuerySet[TaskHistory] | None = None,
) -> Bulk:
    """Retry the failed and cancelled runs `found` names that no operator retry names yet
    (with `fresh`, a pipeline starts over rather than resuming), each as a new run at
    priority 1; among `runs` when given."""

    def act(run_id: str) -> Acted:
        handle = rerun(run_id, actor=actor, reuse=False if fresh else None, once=True)
        return Acted(run_id, "retried", new_run_id=handle.run_id)

    chosen = search.matching(found, runs).filter(state__in=RETRYABLE).exclude(_retried())
    return _each(chosen, act, dry_run)


def _retried() -> Exists:
    """A run an operator retry names."""
    return Exists(retries_of(OuterRef("id")))


# A run's own refusal: reported as its outcome, the others go on.
_REFUSALS = (NotCancellable, UnknownRun, StartRefused, Refused, UnknownTaskError)


def _each(runs: QuerySet[TaskHistory], act: Callable[[str], Acted], dry_run: bool) -> Bulk:
    if dry_run:
        return Bulk(runs.count(), (), False)
    ids = list(runs.order_by("created_at", "id").values_list("id", flat=True)[: BULK_MAX + 1])
    more = len(ids) > BULK_MAX
    matched = runs.count() if more else len(ids)  # before any is acted on
    return Bulk(matched, tuple(_acted(act, run_id) for run_id in ids[:BULK_MAX]), more)


def _acted(act: Callable[[str], Acted], run_id: str) -> Acted:
    try:
        return act(run_id)
    except _REFUSALS as exc:
        return Acted(run_id, "refused", str(exc))
    except Exception as exc:
        # A store that failed this run (Valkey away): the runs before it were acted on and
        # are reported; this one is too, and the next ones are tried.
        log.exception("run %s: a bulk action failed", run_id)
        return Acted(run_id, "error", f"{type(exc).__name__}: {exc}")
