"""Finding runs over HTTP (`runs.search`), and acting on all it finds (`runs.bulk`).

`GET /runs` takes the filter as query parameters: `task`, `state`, `trigger_kind`, `parent`,
`since`, `tag` (repeated: every one), and `input.<field>=<value>` for equality on a top-level
input field (a value matches the JSON it reads as and the text itself: `input.library_id=7`
finds 7 and "7"). `POST /runs:cancel` and `POST /runs:retry` take the same filter as a JSON
body's `filter` (`input` then an object whose values are compared exactly), and `dry_run`;
each acts on at most 10,000 runs, oldest first, and reports each one's outcome.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import ConfigDict, StrictBool

from orchestrator.api.auth import OPERATE, current_user
from orchestrator.api.errors import ApiError, answers
from orchestrator.api.fields import StorableStr
from orchestrator.api.starting import Tag, TimeText
from orchestrator.runs import bulk, search, tags
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind

router = Router(tags=["runs"])
INPUT_PREFIX = "input."
INPUT_AT = ("body", "body", "filter", "input")


class FilterIn(Schema):
    """What `GET /runs` and the bulk actions narrow by; `input` is the query's `input.<field>`
    parameters, or the body's object."""

    task: StorableStr | None = None
    state: RunState | None = None
    trigger_kind: TriggerKind | None = None
    parent: StorableStr | None = Field(None, description="a run's id: its children")
    since: TimeText | None = Field(
        None, description="runs created at or after this time (RFC 3339, with its offset)"
    )
    tag: list[Tag] = Field(
        default_factory=list, max_length=tags.MAX_TAGS, description="runs with every one"
    )

    def found(self, input: dict[str, tuple[search.JSONScalar, ...]]) -> search.RunFilter:
        return search.RunFilter(
            task=self.task,
            state=self.state,
            trigger_kind=self.trigger_kind,
            parent=self.parent,
            since=self.since,
            input=input,
            tags=tuple(self.tag),
        )


def query_filter(request: HttpRequest, filters: FilterIn) -> search.RunFilter:
    """A query string's filter, its `input.<field>` parameters read from the request (a
    schema cannot name fields it does not know)."""
    pairs = [
        (key.removeprefix(INPUT_PREFIX), value)
        for key, values in request.GET.lists()
        if key.startswith(INPUT_PREFIX)
        for value in values
    ]
    return filters.found(_terms(search.input_terms, pairs, ("query", "input")))


class BodyFilterIn(FilterIn):
    model_config = ConfigDict(extra="forbid")

    input: dict[str, Any] = Field(
        default_factory=dict,
        description="top-level input fields and the values they equal (string, number, "
        "boolean or null)",
    )


class BulkIn(Schema):
    model_config = ConfigDict(extra="forbid")

    filter: BodyFilterIn = Field(description="the runs to act on; at least one criterion")
    dry_run: StrictBool = Field(False, description="only count the runs it would act on")


class CancelManyIn(BulkIn):
    kill: StrictBool = Field(False, description="kill now: do not wait for running handlers")


class RetryManyIn(BulkIn):
    fresh: StrictBool = Field(False, description="a pipeline starts over rather than resuming")


class ActedOut(Schema):
    run_id: str
    outcome: str = Field(description="cancelled, cancelling, retried or refused")
    detail: str = ""
    new_run_id: str | None = Field(None, description="a retry's new run")


class BulkOut(Schema):
    dry_run: bool
    matched: int = Field(description="runs the filter finds that the action applies to")
    more: bool = Field(description="more matched than one call acts on: call again")
    items: list[ActedOut]


@router.post("/runs:cancel", auth=OPERATE, response=answers({200: BulkOut}, 422))
def cancel_runs(request: HttpRequest, body: CancelManyIn) -> BulkOut:
    """Cancel (or kill now) every live run the filter finds, at most 10,000 a call."""
    actor = current_user(request).username
    found = bulk.cancel(_body_filter(body), actor=actor, kill=body.kill, dry_run=body.dry_run)
    return _answer(body, found)


@router.post("/runs:retry", auth=OPERATE, response=answers({200: BulkOut}, 422))
def retry_runs(request: HttpRequest, body: RetryManyIn) -> BulkOut:
    """Retry every failed or cancelled run the filter finds, at most 10,000 a call, each as a
    new run at priority 1."""
    actor = current_user(request).username
    found = bulk.retry(_body_filter(body), actor=actor, fresh=body.fresh, dry_run=body.dry_run)
    return _answer(body, found)


def _body_filter(body: BulkIn) -> search.RunFilter:
    found = body.filter.found(_terms(search.exact_terms, body.filter.input, INPUT_AT))
    if found == search.RunFilter():
        raise ApiError(
            422,
            "a bulk action needs a filter: give at least one of task, state, trigger_kind, "
            "parent, since, tag or input",
            [{"loc": ["body", "body", "filter"], "msg": "no criterion"}],
        )
    return found


def _terms(read: Any, given: Any, at: tuple[str, ...]) -> dict[str, tuple[search.JSONScalar, ...]]:
    try:
        terms: dict[str, tuple[search.JSONScalar, ...]] = read(given)
    except search.BadFilter as exc:
        raise ApiError(422, str(exc), [{"loc": [*at], "msg": str(exc)}]) from None
    return terms


def _answer(body: BulkIn, found: bulk.Bulk) -> BulkOut:
    return BulkOut(
        dry_run=body.dry_run,
        matched=found.matched,
        more=found.more,
        items=[ActedOut(**dataclasses.asdict(acted)) for acted in found.items],
    )
