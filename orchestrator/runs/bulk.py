"""Cancel or retry every run a filter finds (`runs.search`): the API's `POST /runs:cancel` and
`/runs:retry`, the console's actions on a filtered list, the CLI.

Each run goes through the one-run path (`cancel.request_cancel`, `rerun.rerun`), so a bulk
action does exactly what as many single actions would, and each run's outcome is reported.
A call acts on at most BULK_MAX runs, oldest first; `more` says the filter found others (call
again: the ones acted on no longer match, being cancelled or retried). A dry run counts only.

A retry by filter leaves out the runs an operator retry already names, so the same call made
again retries the rest, never a run twice.

Not guaranteed: a run that changes state between the filter's read and its own action is
reported as refused (it has ended, or it was retried meanwhile), never acted on twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from django.db.models import Exists, OuterRef
from django.db.models.fields.json import KT

from orchestrator.hooks.base import Refused
from orchestrator.models import TaskHistory
from orchestrator.runs import search
from orchestrator.runs.cancel import NotCancellable, UnknownRun, request_cancel
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.rerun import RETRYABLE, rerun
from orchestrator.states import RunState

BULK_MAX = 10_000
CANCELLABLE = (RunState.PENDING, RunState.ACTIVE)
# Kill now also reaches a run already cancelling: its handler is not waited for.
KILLABLE = (*CANCELLABLE, RunState.CANCELLING)


@dataclass(frozen=True)
class Acted:
    run_id: str
    outcome: str  # cancelled, cancelling, retried, refused
    detail: str = ""
    new_run_id: str | None = None  # a retry's run


@dataclass(frozen=True)
class Bulk:
    matched: int  # the runs the filter finds that the action applies to
    items: tuple[Acted, ...]  # none on a dry run
    more: bool  # more matched than one call acts on


def cancel(
    found: search.RunFilter, *, actor: str, kill: bool = False, dry_run: bool = False
) -> Bulk:
    """Cancel (with `kill`: kill now) the live runs `found` names."""
    act = partial(cancel_one, actor=actor, kill=kill)
    return _each(found, KILLABLE if kill else CANCELLABLE, act, dry_run)


def retry(
    found: search.RunFilter, *, actor: str, fresh: bool = False, dry_run: bool = False
) -> Bulk:
    """Retry the failed and cancelled runs `found` names (with `fresh`, a pipeline starts over
    rather than resuming), each as a new run at priority 1."""
    act = partial(retry_one, actor=actor, fresh=fresh)
    return _each(found, RETRYABLE, act, dry_run, unless=_retried)


def cancel_one(run_id: str, *, actor: str, kill: bool = False) -> Acted:
    """One run's cancel, its refusal an outcome (the console's actions on chosen runs too)."""
    try:
        state = request_cancel(run_id, actor=actor, kill=kill)
    except (NotCancellable, UnknownRun) as exc:
        return Acted(run_id, "refused", str(exc))
    return Acted(run_id, state.value)


def retry_one(run_id: str, *, actor: str, fresh: bool = False) -> Acted:
    """One run's retry, its refusal an outcome."""
    try:
        handle = rerun(run_id, actor=actor, reuse=False if fresh else None)
    except (StartRefused, Refused, UnknownRun) as exc:
        return Acted(run_id, "refused", str(exc))
    return Acted(run_id, "retried", new_run_id=handle.run_id)


def _retried() -> Exists:
    """A run an operator retry names (`trigger.retryOf`, its own index)."""
    retries = TaskHistory.objects.alias(retry_of=KT("trigger__retryOf"))
    return Exists(retries.filter(trigger__has_key="retryOf", retry_of=OuterRef("id")))


def _each(
    found: search.RunFilter,
    states: tuple[RunState, ...],
    act: Callable[[str], Acted],
    dry_run: bool,
    unless: Callable[[], Exists] | None = None,
) -> Bulk:
    if found.state is not None and found.state not in states:
        return Bulk(0, (), False)
    runs = search.matching(found).filter(state__in=states)
    if unless is not None:
        runs = runs.exclude(unless())
    if dry_run:
        return Bulk(runs.count(), (), False)
    ids = list(runs.order_by("created_at", "id").values_list("id", flat=True)[: BULK_MAX + 1])
    more = len(ids) > BULK_MAX
    matched = runs.count() if more else len(ids)  # before any is acted on
    return Bulk(matched, tuple(act(run_id) for run_id in ids[:BULK_MAX]), more)
