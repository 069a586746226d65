"""Task definitions the test suite runs on real workers (loaded via LUMASTRA_TASK_MODULES)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from orchestrator import valkey
from tasks import (
    FatalError,
    NoInput,
    PermanentError,
    Quotas,
    TaskContext,
    TransientError,
    define_task,
)

ORDER_KEY = "test:pickup-order"


def _noop(ctx: TaskContext, params: NoInput) -> dict[str, bool]:
    return {"ok": True}


noop = define_task(id="test-noop", resource_class="io", execute=_noop)


def _noop_keyed(ctx: TaskContext, params: BaseModel) -> dict[str, bool]:
    return {"ok": True}


class FailInput(BaseModel, extra="forbid"):
    how: Literal["permanent", "fatal", "transient", "crash"]


def _fail(ctx: TaskContext, params: FailInput) -> None:
    errors = {"permanent": PermanentError, "fatal": FatalError, "transient": TransientError}
    if params.how == "crash":
        raise ZeroDivisionError("the handler divided by zero")
    raise errors[params.how](f"asked to fail as {params.how}")


fail = define_task(id="test-fail", resource_class="io", execute=_fail, input_model=FailInput)


class LabelInput(BaseModel, extra="forbid"):
    label: str


def _record_order(ctx: TaskContext, params: LabelInput) -> None:
    valkey.client().rpush(ORDER_KEY, params.label)


record_order = define_task(
    id="test-record-order",
    resource_class="maintenance",
    execute=_record_order,
    input_model=LabelInput,
)

versioned = define_task(
    id="test-versioned", resource_class="io", execute=_noop, processing_version=2
)

quota_limited = define_task(
    id="test-quota",
    resource_class="io",
    execute=_fail,
    input_model=FailInput,
    quotas=Quotas(max_runs_per_day=3),
)


class KeyInput(BaseModel, extra="forbid"):
    key: str


def _by_key(params: KeyInput) -> str:
    return params.key


# Identity-deduplicated; its queue is private so runs stay live until a test's own worker.
unique = define_task(
    id="test-unique",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
)
exclusive_a = define_task(
    id="test-excl-a",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
    exclusive_with=["test-excl-b"],
)
exclusive_b = define_task(
    id="test-excl-b",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
)
unique_with_quota = define_task(
    id="test-unique-quota",
    resource_class="io",
    execute=_noop_keyed,
    input_model=KeyInput,
    identity_for=_by_key,
    quotas=Quotas(max_runs_per_day=1),
)
