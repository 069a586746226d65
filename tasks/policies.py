"""How long a task or a stage may run, how it is watched, and how it is tried again: shared by
tasks and stages."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

MAX_KEY = 200
_KEY_BREAKS = re.compile(r"[\x00-\x1f\x7f]")


_RATE = re.compile(r"^(\d+)/(\d*)(s|m|h)$")
_UNITS = {"s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1)}


@dataclass(frozen=True)
class Rate:
    """At most `count` per `per`: "60/m", "40/10s", "1000/h"."""

    count: int
    per: timedelta

    @classmethod
    def parse(cls, text: str) -> Rate:
        match = _RATE.match(text)
        if not match:
            raise ValueError(f"bad rate {text!r}: expected e.g. '60/m' or '40/10s' (s, m or h)")
        count, span = int(match.group(1)), int(match.group(2) or 1)
        if count < 1 or span < 1:
            raise ValueError(f"bad rate {text!r}: the count and the span must be at least 1")
        return cls(count, span * _UNITS[match.group(3)])


@dataclass(frozen=True)
class Timeout:
    soft: timedelta  # the handler gets a chance to clean up
    hard: timedelta  # the process running it is killed


@dataclass(frozen=True)
class Retry:
    """How a run that raised TransientError is tried again: exponential backoff from `base`,
    doubling per attempt, capped at `cap`, jittered over its upper half. `max_attempts`
    counts the first attempt."""

    max_attempts: int = 3
    base: timedelta = timedelta(seconds=2)
    cap: timedelta = timedelta(minutes=5)


@dataclass(frozen=True)
class Stall:
    """How long a handler may go without a sign of progress (`report_progress` or `log`)
    before a warning and before its run fails as `stalled`; a `fail` of None: the resource
    class's (`tasks.resources.default_stall_fail_s`, LUMASTRA_STALL_FAIL_S_<CLASS>); a `warn`
    of None: a fifth of the fail window. `auto=True` counts a handler that is still running
    as alive (long ffmpeg- or chromaprint-like calls that cannot report): only its hard
    timeout stops it. A command run with `ctx.run_process` reports by its output."""

    warn: timedelta | None = None
    fail: timedelta | None = None
    auto: bool = False


@dataclass(frozen=True)
class Debounce:
    """Starts of one identity that come in a burst make one run, with the last start's input:
    a start finds the run an earlier start recorded, still waiting, replaces its input and moves
    its start to `period_s` from now, never later than `max_wait_s` after the first start
    (`orchestrator.runs.coalesce`)."""

    period_s: int
    max_wait_s: int


@dataclass(frozen=True)
class Throttle:
    """At most one run per identity per `period_s`: a later start is answered `throttled` with
    the run it met and when the next may start (`orchestrator.hooks.throttle`)."""

    period_s: int


class WhileActive(StrEnum):
    """What a start does when it meets a live run of its identity (`identity_for`).

    JOIN: it is answered with that run (`deduplicated`). FOLLOW_UP: when that run is already
    running, one follow-up is recorded and starts as a new run once it ends, whatever its end;
    later starts give the follow-up their input (`coalesced`, `orchestrator.runs.coalesce`)."""

    JOIN = "join"
    FOLLOW_UP = "follow_up"


@dataclass(frozen=True)
class Concurrency:
    """At most `max` runs at once per key, across the cluster: `key(params)` names a run's key
    (None: one key for the whole task). The runs over it wait, pending, without an attempt
    spent and without holding back other keys, and keys take turns
    (`orchestrator.hooks.keyed`)."""

    max: int
    key: Callable[[Any], str] | None = None

    def key_of(self, validated_input: BaseModel) -> str:
        """The run's key (ValueError: see `key_from`)."""
        return "" if self.key is None else key_from(self.key, validated_input, "concurrency")


def key_from(function: Callable[[Any], str], validated_input: object, what: str) -> str:
    """A key function's key for an input; ValueError when the function fails on it or answers
    what is not a key (a str of at most MAX_KEY characters, no control
    characters)."""
    try:
        key = function(validated_input)
    except Exception as exc:
        raise ValueError(f"the key function of {what} failed: {exc!r}") from None
    if not isinstance(key, str) or len(key) > MAX_KEY or _KEY_BREAKS.search(key):
        raise ValueError(
            f"{what}: a key is a str of at most {MAX_KEY} characters without "
            f"control characters, not {key!r}"
        )
    return key


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class StartPolicies:
    """A task's declarations of how its starts coalesce and how many of its runs run at once,
    checked together (`define_task`)."""

    debounce: Debounce | None
    throttle: Throttle | None
    while_active: WhileActive
    concurrency: Concurrency | None

    def problem(self, identity: bool, pipeline: bool, limited: bool) -> tuple[str, str] | None:
        """The field and what is wrong with it, given whether the task declares `identity_for`,
        is a pipeline, and declares `quotas.max_concurrent`; None when all is well."""
        debounce, throttle = self.debounce, self.throttle
        if debounce is not None and throttle is not None:
            return "debounce", "a task debounces or throttles its starts, not both"
        if debounce is not None and not identity:
            return "debounce", "needs identity_for: the starts of one identity coalesce"
        if debounce is not None and (problem := _debounce_problem(debounce)):
            return "debounce", problem
        if throttle is not None and not (
            isinstance(throttle, Throttle) and _whole(throttle.period_s)
        ):
            return "throttle", "must be Throttle(period_s=) with whole seconds, at least 1"
        if (debounce or throttle) and pipeline:
            return (
                "debounce" if debounce else "throttle",
                "a pipeline task's starts do not coalesce",
            )
        if self.while_active is WhileActive.FOLLOW_UP:
            if not identity:
                return "while_active", "follow_up needs identity_for: one follow-up per identity"
            if debounce is not None or throttle is not None:
                return (
                    "while_active",
                    "a task's starts coalesce one way: debounce, throttle or follow_up",
                )
        concurrency = self.concurrency
        if concurrency is not None and (
            problem := _concurrency_problem(concurrency, pipeline, limited)
        ):
            return "concurrency", problem
        return None


def _debounce_problem(debounce: object) -> str | None:
    if not isinstance(debounce, Debounce):
        return "must be Debounce(period_s=, max_wait_s=)"
    if not (_whole(debounce.period_s) and _whole(debounce.max_wait_s)):
        return "period_s and max_wait_s must be whole seconds, at least 1"
    if debounce.max_wait_s < debounce.period_s:
        return "max_wait_s must be at least period_s"
    return None


def _concurrency_problem(concurrency: object, pipeline: bool, limited: bool) -> str | None:
    if not isinstance(concurrency, Concurrency):
        return "must be Concurrency(max=, key=)"
    if not _whole(concurrency.max):
        return "max must be a whole number, at least 1"
    if concurrency.key is not None and not callable(concurrency.key):
        return "key must be a function of the task's input, or None"
    if limited:
        return "a task limits its runs at once one way: concurrency or quotas.max_concurrent"
    if pipeline:
        return "a pipeline task's stages are limited by quotas.max_concurrent"
    return None
