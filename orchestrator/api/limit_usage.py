"""`GET /limits` (issue 39): every named limit (`define_limit`) and every task's keyed
concurrency (`Concurrency(key=, max=)`), each key with what it uses now: units in use, runs
waiting, a rate's admissions in its window, a keyed concurrency's turn. Read from Valkey
(`hooks.limits.usage`, `hooks.keyed.usage`); the Limits page shows the same."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Overview:
    """What the API and the Limits page show of one limit."""

    name: str
    kind: str
    rate: str | None
    concurrency: int | None
    keyed: bool
    wait_s: float | None
    tasks: list[str]
    keys: list[limits.KeyUse]


def overview() -> list[Overview]:
    """Every named limit, then every task's keyed concurrency, by name."""
    definitions = registry.get()
    found = [
        Overview(
            limit.id,
            "limit",
            limit.rate_text,
            limit.concurrency,
            limit.key is not None,
            limit.wait_s,
            sorted(d.id for d in definitions.values() if limit.id in d.limits),
            limits.usage(limit),
        )
        for limit in sorted(definitions.limits.values(), key=lambda limit: limit.id)
    ]
    for definition in sorted(definitions.values(), key=lambda d: d.id):
        if definition.concurrency is not None:
            found.append(
                Overview(
                    definition.id,
                    "concurrency",
                    None,
                    definition.concurrency.max,
                    definition.concurrency.key is not None,
                    None,
                    [definition.id],
                    keyed.usage(definition),
                )
            )
    return found


@router.get("/limits", auth=VIEW, response=answers({200: list[LimitOut]}))
def list_limits(request: HttpRequest) -> list[LimitOut]:
    """Every named limit and keyed concurrency, each key with what it uses now."""
    return [
        LimitOut(
            name=o.name,
            kind=o.kind,
            rate=o.rate,
            concurrency=o.concurrency,
            keyed=o.keyed,
            wait_s=o.wait_s,
            tasks=o.tasks,
            keys=[KeyOut(**use.__dict__) for use in o.keys],
        )
        for o in overview()
    ]
