"""How a failed attempt reads, tried again or not: one wording for plain runs, pipeline stages
and runs put back after a lost worker, so an operator reads (and the admin filters) the same
words whichever path failed."""

from __future__ import annotations

from datetime import timedelta


def retrying(attempt: int, max_attempts: int, delay: timedelta) -> str:
    """What an attempt that is tried again adds to its error: its number and the wait."""
    return f"attempt {attempt} of {max_attempts}; retrying in {delay.total_seconds():.1f}s"


def exhausted(message: str, attempt: int, max_attempts: int) -> str:
    """The error of a last attempt, the run a dead letter."""
    return f"{message} (attempts exhausted: {attempt} of {max_attempts})"
