"""Exponential backoff, capped before it is computed.

Every growing delay in the engine (concurrency postponements, run retries, drain passes,
a lost leader seat) goes through `exponential`. Growing first and capping after overflows once the
step count is large: `timedelta * 1.5 ** 82` no longer fits a timedelta, and a run postponed
that often crashed on every pickup. Here the exponent is clamped to the first step that
reaches the cap, so any step count, however large, costs the same and returns the cap.
"""

from __future__ import annotations

import math
import random
from datetime import timedelta

from tasks.policies import Retry


def exponential(base: timedelta, growth: float, step: int, cap: timedelta) -> timedelta:
    """`base * growth ** step`, at most `cap`, for any `step` (negative counts as 0)."""
    if base >= cap:
        return cap
    steps_to_cap = math.ceil(math.log(cap / base, growth))
    return min(cap, base * growth ** min(max(0, step), steps_to_cap))


def jittered_backoff(retry: Retry, attempt: int) -> timedelta:
    """The wait before the attempt after `attempt`: jitter over the upper half of an
    exponential ceiling, so retries of many runs spread out instead of returning together,
    and none comes back much sooner than its backoff."""
    ceiling = exponential(retry.base, 2, attempt - 1, retry.cap)
    return ceiling * random.uniform(0.5, 1.0)
