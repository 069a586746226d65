"""Identity dedup: at most one live run per identity, across processes and across time.

Applies to tasks that declare `identity_for` (their identity names the work; not a debounced
task's, whose identity `runs.coalesce` owns) and to tasks in an `exclusive_with` group (the
group shares one identity space: a run of one task blocks the same identity for every task of
the group): `applies`, from `scope`. Other tasks are never deduplicated by identity, and their
runs never call this hook; their callers can still pass an idempotency key (a partial unique
index, see models).

How: `SET task:identity:<scope>:<identity> <runId>` is claimed in Valkey before the Postgres
insert with a short provisional TTL (LUMASTRA_IDENTITY_PROVISIONAL_TTL_S), extended to
LUMASTRA_IDENTITY_TTL_S once the insert commits, and released when the run ends. A start that
finds the identity held by a live run of the same task gets that run back (deduplicated);
held by another task of its group, it is refused. A holder that has ended, or whose row is
gone after its key was confirmed, is replaced.

Not guaranteed: if the process dies (or the caller's transaction rolls back) between the
claim and the commit, the identity stays blocked until the provisional TTL runs out — at most
LUMASTRA_IDENTITY_PROVISIONAL_TTL_S seconds. Within that window a concurrent start is answered
with the provisional holder's run id, whose row becomes visible when its transaction commits.
If Valkey becomes unreachable between the claim and the commit, the start still returns its
run (committed, published by the reconciler's pending check), but its identity is not extended;
the pending check holds it again when it publishes the run or seeds its lost hash
(`plan_republished`, as after a Valkey restart that lost every key). Until then, once the
provisional TTL has run out, a start of the same identity is not deduplicated: the check runs
every reconciler tick, on runs pending longer than LUMASTRA_PENDING_CHECK_AFTER_S.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings

from orchestrator.clock import SYSTEM, span_ms
from orchestrator.hooks.base import (
    Admission,
    Deduplicated,
    Outcome,
    Part,
    Refused,
    Republished,
    RunHook,
)
from orchestrator.models import TaskHistory
from orchestrator.states import LIVE_RUN_STATES, RunState
from orchestrator.stores import keys, valkey
from tasks import registry
from tasks.definition import TaskDefinition

log = logging.getLogger(__name__)

# Holders replaced in one admission before giving up: each replacement means a run ended or
# vanished while we looked, so more than a few in a row is a fight worth reporting.
MAX_REPLACEMENTS = 3


class ExclusiveRunning(Refused):
    code = "exclusive_running"
    http_status = 409


class IdentityBusy(Refused):
    code = "identity_busy"
    http_status = 409


def scope(definition: TaskDefinition) -> str | None:
    """The identity namespace of a task: its exclusive group, itself, or None (no dedup)."""
    tasks = registry.get()
    group = {definition.id}
    frontier = [definition.id]
    while frontier:
        current = tasks[frontier.pop()]
        linked = set(current.exclusive_with) | {
            other.id for other in tasks.values() if current.id in other.exclusive_with
        }
        for task_id in linked - group:
            group.add(task_id)
            frontier.append(task_id)
    if len(group) > 1:
        return "+".join(sorted(group))
    return definition.id if definition.identity_for is not None else None


def _hold(key: str, run_id: str, ttl_ms: int) -> None:
    valkey.script("identity_hold", [key], [run_id, ttl_ms])


def _confirm(key: str, run_id: str, not_before: datetime | None = None) -> None:
    """The committed run's identity held for LUMASTRA_IDENTITY_TTL_S (a delayed start's: from
    its time on). Runs after the commit, before the run is published: a failure (Valkey
    unreachable) is logged, never raised, or the caller would be told its start failed for a
    run that exists (and retry it), and the publish after it would be skipped."""
    ttl = timedelta(seconds=settings.CONFIG.identity_ttl_s)
    if not_before is not None:
        ttl += max(timedelta(0), not_before - SYSTEM.now())
    try:
        _hold(key, run_id, span_ms(ttl))
    except Exception:
        log.exception(
            "run %s: identity %s not confirmed; it lapses with its provisional TTL", run_id, key
        )


@dataclass
class IdentityDedup(RunHook):
    name: str = "dedup"

    def applies(self, definition: TaskDefinition) -> bool:
        # A debounced task's identity is the debounce's (`runs.coalesce`): one waiting run,
        # which later starts join, and while it runs the next burst waits as a run of its own.
        return scope(definition) is not None and definition.debounce is None

    def plan_admit(self, admission: Admission) -> Part | None:
        namespace = scope(admission.definition)
        if namespace is None:
            return None
        key = keys.identity(namespace, admission.identity)
        provisional_ms = span_ms(timedelta(seconds=settings.CONFIG.identity_provisional_ttl_s))
        first: list[object] = [admission.run_id, provisional_ms, ""]

        def receive(replies: list[Any]) -> None:
            answer = valkey.script_replied("identity_claim", [key], first, replies[0])
            self._claim(admission, key, provisional_ms, answer)

        # The first claim goes out with the circuit's check; its verdict is still the first.
        return Part(receive, lambda pipe: valkey.queue_script(pipe, "identity_claim", [key], first))

    def _claim(self, admission: Admission, key: str, provisional_ms: int, answer: str) -> None:
        for attempt in range(1, MAX_REPLACEMENTS + 1):
            if answer == "":
                admission.committed.append(
                    partial(_confirm, key, admission.run_id, admission.not_before)
                )
                return
            holder, pttl = answer.split(" ")
            row = TaskHistory.objects.filter(id=holder).values_list("task_id", "state").first()
            if row is None and 0 <= int(pttl) <= provisional_ms:
                # Its insert has not committed yet: the holder is the run doing this work.
                raise Deduplicated(holder)
            if row is not None and row[1] in LIVE_RUN_STATES:
                if row[0] == admission.definition.id:
                    raise Deduplicated(holder)
                raise ExclusiveRunning(
                    f"task {admission.definition.id!r} is exclusive with {row[0]!r}, whose run "
                    f"{holder} holds identity {admission.identity!r}; retry when it ends"
                )
            if attempt < MAX_REPLACEMENTS:
                answer = valkey.script(
                    "identity_claim", [key], [admission.run_id, provisional_ms, holder]
                )
        raise IdentityBusy(
            f"identity {admission.identity!r} of task {admission.definition.id!r} changed "
            f"hands {MAX_REPLACEMENTS} times while starting; retry"
        )

    def abandoned(self, admission: Admission) -> None:
        namespace = scope(admission.definition)
        if namespace is not None:
            _hold(keys.identity(namespace, admission.identity), admission.run_id, 0)

    def plan_finished(self, outcome: Outcome) -> Part | None:
        namespace = scope(outcome.definition)
        if namespace is None:
            return None
        return Part(lambda replies: _let_go(namespace, outcome.run_id))

    def plan_republished(self, run: Republished) -> Part | None:
        """A live run that Valkey may have forgotten (its message published again, its hash
        seeded again) holds its identity again for LUMASTRA_IDENTITY_TTL_S, unless another run
        took it meanwhile (logged: the lapse let a second start in). Logged, never raised, as
        `_confirm`."""
        namespace = scope(run.definition)
        if namespace is None:
            return None
        key = keys.identity(namespace, run.identity)
        args: list[object] = [
            run.run_id,
            span_ms(timedelta(seconds=settings.CONFIG.identity_ttl_s)),
            "",
        ]

        def receive(replies: list[Any]) -> None:
            try:
                answer = valkey.script_replied("identity_claim", [key], args, replies[0])
            except Exception:
                log.exception("run %s: identity %s not held again", run.run_id, key)
                return
            if answer:
                holder = answer.split(" ")[0]
                log.warning("run %s: identity %s is held by run %s", run.run_id, key, holder)

        return Part(receive, lambda pipe: valkey.queue_script(pipe, "identity_claim", [key], args))


def _let_go(namespace: str, run_id: str) -> None:
    """The ended run's identity released, or handed to the follow-up its end released
    (`runs.coalesce`), so that a start meanwhile joins that follow-up rather than start a run
    beside it."""
    row = (
        TaskHistory.objects.filter(id=run_id)
        .values_list("task_id", "identity", "trigger__followed")
        .first()
    )
    if row is None:
        return
    task_id, identity, followed = row
    key = keys.identity(namespace, identity)
    follow_up = None
    if followed:
        follow_up = (
            TaskHistory.objects.filter(
                task_id=task_id, identity=identity, state=RunState.PENDING, trigger__follows=run_id
            )
            .values_list("id", flat=True)
            .first()
        )
    if follow_up is None:
        _hold(key, run_id, 0)
        return
    ttl_ms = span_ms(timedelta(seconds=settings.CONFIG.identity_ttl_s))
    valkey.script("identity_claim", [key], [follow_up, ttl_ms, run_id])
