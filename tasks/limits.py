"""Named limits shared across tasks (issue 39): `define_limit` in a definitions module, used by
tasks with `limits=("tmdb",)` and inside a handler with `with ctx.limit("tmdb"):`.

    tmdb = define_limit("tmdb", rate="40/10s")
    disk = define_limit("disk", concurrency=1, key=lambda params: params.library_id)

A limit has a rate (at most `count` admissions per span), a concurrency (at most that many
holders at once), or both; with `key`, each key of it is counted on its own (the function gets
the task's validated input; a task whose input it fails on is refused at start, a 422 naming
`limits.<id>.key`). The budget is cluster-wide, in Valkey (`orchestrator.hooks.limits`).

A task's `limits` are taken at pickup, all or none: a run that finds one spent waits, pending,
with no attempt spent, until it can take them. `ctx.limit(id, units=...)` takes `units` inside
the handler (a concurrency unit is held for the `with` block), waiting its turn up to the
limit's `wait_s`; past it, the run is put back pending for later, its attempt not spent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.errors import ManifestError
from tasks.policies import Rate, key_from

_LIMIT_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
DEFAULT_WAIT_S = 30.0


@dataclass(frozen=True)
class LimitDefinition:
    id: str
    rate: Rate | None
    concurrency: int | None
    key: Callable[[Any], str] | None
    wait_s: float  # how long `ctx.limit` waits for its turn before the run is put back
    rate_text: str | None = None  # as declared, for people

    def key_of(self, validated_input: object) -> str:
        """The key a run of this input counts under (ValueError: `policies.key_from`)."""
        return "" if self.key is None else key_from(self.key, validated_input, f"limit {self.id!r}")


def define_limit(
    id: str,
    *,
    rate: str | None = None,
    concurrency: int | None = None,
    key: Callable[[Any], str] | None = None,
    wait_s: float = DEFAULT_WAIT_S,
) -> LimitDefinition:
    """Declare a limit. Assign the result to a module-level name in a module the registry
    loads; tasks name it in `limits=`, handlers in `ctx.limit(...)`."""

    def fail(field: str, problem: str) -> ManifestError:
        return ManifestError(id, field, problem, what="limit")

    if not isinstance(id, str) or not _LIMIT_ID.match(id):
        raise fail("id", "must be lowercase letters, digits and dashes, starting with a letter")
    if rate is None and concurrency is None:
        raise fail("rate", "a limit has a rate, a concurrency, or both")
    parsed = None
    if rate is not None:
        try:
            parsed = Rate.parse(rate)
        except (ValueError, TypeError) as exc:
            raise fail("rate", str(exc)) from None
    if concurrency is not None and (
        not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
    ):
        raise fail("concurrency", "must be a whole number, at least 1")
    if key is not None and not callable(key):
        raise fail("key", "must be a function of a task's input, or None")
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 <= wait_s <= 300:
        raise fail("wait_s", "must be a number of seconds from 0 to 300")
    return LimitDefinition(id, parsed, concurrency, key, float(wait_s), rate)
