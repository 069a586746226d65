"""`GET /limits` (issue 39): every named limit (`define_limit`) and every task's keyed
concurrency (`Concurrency(key=, max=)`), each key with what it uses now: units in use, runs
waiting, a rate's admissions in its window, a keyed concurrency's turn. Read from Valkey
(`hooks.limits.usage`, `hooks.keyed.usage`); the Limits page shows the same."""

from __future__ import annotations

import dataclasses

from django.http import HttpRequest
from ninja import Field, Router, Schema

from orchestrator.api.auth import VIEW
from orchestrator.api.errors import answers
from orchestrator.hooks import keyed, limits
from tasks import registry

router = Router(tags=["limits"])


class KeyOut(Schema):
    key: str = Field(description='the key ("" for a limit without a key function)')
    in_use: int = Field(description="concurrency units (places) held under live leases")
    waiting: int = Field(description="runs that found no room and wait for it")
    rate_used: int | None = Field(None, description="admissions within the rate's window")
    turn: str | None = Field(None, description="keyed concurrency: the run published for its turn")


class LimitOut(Schema):
    name: str = Field(description="the limit's id; a keyed concurrency: its task's id")
    kind: str = Field(description="limit (define_limit) or concurrency (a task's Concurrency)")
    rate: str | None = Field(None, description='as declared, e.g. "40/10s"')
    concurrency: int | None = Field(None, description="places per key")
    keyed: bool = Field(description="counted per key (a key function)")
    wait_s: float | None = Field(None, description="how long ctx.limit waits for room")
    tasks: list[str] = Field(description="the tasks that take it at pickup")
    keys: list[KeyOut]


def _keys(uses: list[limits.KeyUse]) -> list[KeyOut]:
    return [KeyOut(**dataclasses.asdict(use)) for use in uses]


def overview() -> list[LimitOut]:
    """Every named limit, then every task's keyed concurrency, by name: what the API answers and
    the Limits page shows."""
    definitions = registry.get()
    found = [
        LimitOut(
            name=limit.id,
            kind="limit",
            rate=limit.rate_text,
            concurrency=limit.concurrency,
            keyed=limit.key is not None,
            wait_s=limit.wait_s,
            tasks=sorted(d.id for d in definitions.values() if limit.id in d.limits),
            keys=_keys(limits.usage(limit)),
        )
        for limit in sorted(definitions.limits.values(), key=lambda limit: limit.id)
    ]
    for definition in sorted(definitions.values(), key=lambda d: d.id):
        if definition.concurrency is not None:
            found.append(
                LimitOut(
                    name=definition.id,
                    kind="concurrency",
                    rate=None,
                    concurrency=definition.concurrency.max,
                    keyed=definition.concurrency.key is not None,
                    wait_s=None,
                    tasks=[definition.id],
                    keys=_keys(keyed.usage(definition)),
                )
            )
    return found


@router.get("/limits", auth=VIEW, response=answers({200: list[LimitOut]}))
def list_limits(request: HttpRequest) -> list[LimitOut]:
    """Every named limit and keyed concurrency, each key with what it uses now."""
    return overview()
