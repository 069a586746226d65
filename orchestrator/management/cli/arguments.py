"""The arguments sub-commands share: who acts and how to print (on every sub-command, so they
may come anywhere after it), and the parsers of a run id, a moment and a KEY=VALUE pair, whose
refusals are argparse's usage errors (exit 2)."""

from __future__ import annotations

import re
from argparse import ArgumentParser, ArgumentTypeError
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings

from orchestrator.text import is_run_id

_AGO = re.compile(r"(\d{1,6})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def common() -> ArgumentParser:
    """The parent parser of every sub-command: --as and --json."""
    parser = ArgumentParser(add_help=False)
    parser.add_argument(
        "--as",
        dest="acting_user",
        metavar="USERNAME",
        help="the account to act as (default: LUMASTRA_CLI_USER); it needs the view "
        "permission to read, operate to act",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document (the API's) instead"
    )
    return parser


def run_id(text: str) -> str:
    if not is_run_id(text):
        raise ArgumentTypeError(f"{text[:100]!r} is not a run id (run_ and 26 letters or digits)")
    return text


def moment(text: str) -> datetime:
    """`15m`, `2h`, `7d`, `90s` ago, or an ISO 8601 date or time; one without an offset is
    read in LUMASTRA_TIME_ZONE."""
    ago = _AGO.fullmatch(text.strip())
    if ago:
        span = timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
        return datetime.now(UTC) - span
    try:
        found = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ArgumentTypeError(
            f"{text[:100]!r} is not a time: give 15m, 2h, 7d (ago) or an ISO 8601 time "
            "such as 2025-06-01T08:00:00+02:00"
        ) from None
    if found.tzinfo is None:
        found = found.replace(tzinfo=ZoneInfo(settings.CONFIG.time_zone))
    return found


def pair(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise ArgumentTypeError(f"{text[:100]!r} is not KEY=VALUE")
    return key, value
