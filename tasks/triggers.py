"""`define_trigger`: an inbound trigger, a name integrations POST to that starts a task.

`POST /api/v1/triggers/<name>` (docs/webhooks.md, "Inbound triggers") maps the request's JSON
body to the task's input with `input_from` and starts a run whose trigger is
`{"kind": "webhook", "name": <name>}`. The input is still checked against the task's input
model, so `input_from` only reshapes the body; a body it cannot reshape (a missing key, a
wrong type: `LookupError`, `TypeError`, `ValueError`, `AttributeError`) is refused with a 422.
`idempotency_key_from`, when given, names the run's idempotency key from the body (the
request's `Idempotency-Key` header wins over it), so an integration's retries of one event
join the run the first one started.

The registry checks what only the whole set of definitions can tell: that `task` names a
registered task and that no two triggers share a name. The secret that signs a trigger's
requests is configuration, not code (`LUMASTRA_TRIGGER_SECRET_<NAME>`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tasks.definition import Priority
from tasks.errors import ManifestError

InputFrom = Callable[[dict[str, Any]], Mapping[str, Any]]
KeyFrom = Callable[[dict[str, Any]], str | None]

# Like a task id. Not ending in "-file": the secret's variable of a trigger "x-file" would be
# read as the `_FILE` twin of the variable of a trigger "x".
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


def whole_body(body: dict[str, Any]) -> Mapping[str, Any]:
    """The default `input_from`: the body is the input."""
    return body


@dataclass(frozen=True)
class TriggerDefinition:
    name: str
    task: str
    input_from: InputFrom
    # Passed to `start_run` as the run's priority; None: the task's, else the webhook kind's.
    priority: Priority | None
    description: str = ""
    idempotency_key_from: KeyFrom | None = None


def define_trigger(
    *,
    name: str,
    task: str,
    input_from: InputFrom = whole_body,
    priority: Priority | int | None = None,
    description: str = "",
    idempotency_key_from: KeyFrom | None = None,
) -> TriggerDefinition:
    """Declare an inbound trigger. Assign the result to a module-level name in a module the
    registry loads, beside `define_task`'s."""

    def fail(field_name: str, problem: str) -> ManifestError:
        return ManifestError(name, field_name, problem, what="trigger")

    if not isinstance(name, str) or not _NAME.match(name):
        raise fail("name", "must be lowercase letters, digits and dashes, starting with a letter")
    if name.endswith("-file"):
        raise fail("name", "must not end in '-file' (its secret variable would be a _FILE twin)")
    if not isinstance(task, str) or not task:
        raise fail("task", "must be a task id")
    if problem := _mapper_problem(input_from):
        raise fail("input_from", problem)
    if idempotency_key_from is not None and (problem := _mapper_problem(idempotency_key_from)):
        raise fail("idempotency_key_from", problem)
    chosen = None
    if priority is not None:
        try:
            chosen = Priority(priority)
        except ValueError:
            raise fail("priority", f"{priority!r} is not one of 1, 2, 3, 5, 7") from None
    return TriggerDefinition(name, task, input_from, chosen, description, idempotency_key_from)


def _mapper_problem(mapper: object) -> str | None:
    if not callable(mapper):
        return "must be callable with the request's JSON body"
    try:
        inspect.signature(mapper).bind({})
    except TypeError:
        return "must take one argument, the request's JSON body"
    except ValueError:
        pass  # a callable without a readable signature (a builtin) is taken on trust
    return None
