"""Finding runs by what they were about: the one filter the API (`GET /runs`, the bulk actions),
the console's runs list and the operator CLI share.

A filter narrows by task, state, trigger kind, parent, start time, equality on top-level input
fields and tags. An input field is matched with `input @> {"key": value}` and tags with
`tags @> ARRAY[...]`, each served by its GIN index (`task_history_input`, `jsonb_path_ops`;
`task_history_tags`). A value typed in a query string or a search box ("7", "true") matches the
JSON it reads as (7, true) and the string itself: `library_id=7` finds a run whose input holds
`"library_id": 7` or `"library_id": "7"`.

Tags are given at start (`runs.tags`); a retry keeps its run's.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT

from orchestrator.models import TaskHistory
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.tags import checked
from orchestrator.states import RunState
from orchestrator.text import unstorable
from orchestrator.triggers import TriggerKind

# A filter names at most this many input fields, each value at most this long: each is one
# containment test, served by one index.
MAX_INPUT_FIELDS = 10
MAX_VALUE_CHARS = 1000
_KEY = re.compile(r"[A-Za-z_][\w-]{0,99}")

JSONScalar = str | int | float | bool | None


class BadFilter(ValueError):
    """A filter that cannot be run: what is wrong, and where (`field`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class RunFilter:
    task: str | None = None
    state: RunState | None = None
    trigger_kind: TriggerKind | None = None
    parent: str | None = None
    since: datetime | None = None
    # key → the values any of which the input's field may equal (`typed`).
    input: Mapping[str, tuple[JSONScalar, ...]] = field(default_factory=dict)
    tags: tuple[str, ...] = ()


def matching(found: RunFilter, runs: QuerySet[TaskHistory] | None = None) -> QuerySet[TaskHistory]:
    """The runs `found` names, unordered (the caller pages or counts them)."""
    runs = TaskHistory.objects.all() if runs is None else runs
    if found.task is not None:
        runs = runs.filter(task_id=found.task)
    if found.state is not None:
        runs = runs.filter(state=found.state)
    if found.parent is not None:
        runs = runs.filter(parent_run_id=found.parent)
    if found.since is not None:
        runs = runs.filter(created_at__gte=found.since)
    if found.trigger_kind is not None:
        # `->>` as an alias matches the expression index on trigger kind.
        runs = runs.alias(trigger_kind=KT("trigger__kind")).filter(
            trigger_kind=found.trigger_kind.value
        )
    for key, values in found.input.items():
        either = Q()
        for value in values:
            either |= Q(input__contains={key: value})
        runs = runs.filter(either)
    if found.tags:
        runs = runs.filter(tags__contains=list(found.tags))
    return runs


def typed(raw: str) -> tuple[JSONScalar, ...]:
    """What a value typed as text may stand for: the text, and the number, boolean or null it
    reads as in JSON, if it does (not NaN or an infinity: JSON has none)."""
    if len(raw) > MAX_VALUE_CHARS:
        raise BadFilter("input", f"a value is at most {MAX_VALUE_CHARS} characters")
    if reason := unstorable(raw):
        raise BadFilter("input", f"a value {reason}")
    try:
        read = json.loads(raw, parse_constant=_not_json)
    except ValueError:
        return (raw,)
    if isinstance(read, float) and not math.isfinite(read):
        return (raw,)
    if isinstance(read, int | float | bool) or read is None:
        return (raw, read)
    return (raw,)


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def input_terms(pairs: Iterable[tuple[str, str]]) -> dict[str, tuple[JSONScalar, ...]]:
    """`KEY=VALUE` pairs (a query string's `input.KEY`, the CLI's `--input`) as a filter's
    `input`; a key given twice is refused (each field equals one value)."""
    found: dict[str, tuple[JSONScalar, ...]] = {}
    for key, raw in pairs:
        _check_key(key, found)
        found[key] = typed(raw)
    return found


def exact_terms(document: Mapping[str, Any]) -> dict[str, tuple[JSONScalar, ...]]:
    """A JSON body's `{"key": value}` as a filter's `input`: each value as given."""
    found: dict[str, tuple[JSONScalar, ...]] = {}
    for key, value in document.items():
        _check_key(key, found)
        if not (isinstance(value, str | int | float | bool) or value is None):
            raise BadFilter("input", f"{key}: only a string, number, boolean or null is compared")
        if isinstance(value, float) and not math.isfinite(value):
            raise BadFilter("input", f"{key}: {value} is not a JSON number")
        if isinstance(value, str):
            typed(value)  # the same bounds as a typed value
        found[key] = (value,)
    return found


def _check_key(key: str, found: Mapping[str, object]) -> None:
    if not _KEY.fullmatch(key):
        raise BadFilter("input", f"{key[:100]!r} is not an input field's name")
    if key in found:
        raise BadFilter("input", f"{key} is given twice")
    if len(found) == MAX_INPUT_FIELDS:
        raise BadFilter("input", f"at most {MAX_INPUT_FIELDS} input fields")


def search_terms(text: str) -> RunFilter:
    """The console's search box: space-separated `key=value` (an input field) and `#tag` terms;
    anything else is not a filter (the list's own search takes it)."""
    pairs, tags = [], []
    for term in text.split():
        if term.startswith("#") and len(term) > 1:
            tags.append(term[1:])
        elif "=" in term:
            key, _, value = term.partition("=")
            pairs.append((key, value))
        else:
            raise BadFilter("search", f"{term[:100]!r} is neither key=value nor #tag")
    try:
        return RunFilter(input=input_terms(pairs), tags=checked(tags))
    except StartRefused as exc:
        raise BadFilter("tag", str(exc)) from None
