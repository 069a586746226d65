"""Where notifications go: LUMASTRA_NOTIFY_URLS, Apprise URLs separated by spaces, each one
optionally limited to some kinds with Apprise's own tag syntax, `dead_letter,circuit_open=URL`.

A target is known by `key`, an HMAC of its URL under SECRET_KEY: a notification records the
keys that took it (so a retry sends to the others) without keeping a URL's credentials, or a
digest one could test guesses against, in Postgres. A URL that changes (or a new SECRET_KEY)
makes a new target. Logs and pages name a target by its service and key only (`shown`):
Apprise's own privacy form still shows a `json://` URL's headers and a token given as a user.
Apprise is imported only by the worker role's loops process, which sends.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings

from orchestrator.models import NotificationKind

_KINDS = re.compile(r"^[a-z_]+(,[a-z_]+)*=")
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]{0,30})://")


class InvalidTarget(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    url: str = field(repr=False)
    kinds: frozenset[str]  # empty: every kind
    key: str

    def wants(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds

    def shown(self) -> str:
        """The target as logs and pages may name it: its service and key, no credential."""
        return f"{_scheme(self.url)} target {self.key}"


def _scheme(url: str) -> str:
    found = _SCHEME.match(url)
    return found.group(1) if found else "(no scheme)"


def _key(url: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), url.encode(), hashlib.sha256).hexdigest()[:16]


def parse(entries: Iterable[str]) -> list[Target]:
    """The targets of LUMASTRA_NOTIFY_URLS's entries; raises InvalidTarget naming the entry
    whose kind is unknown or whose URL Apprise cannot send to."""
    import apprise

    known = set(NotificationKind.values)
    targets: list[Target] = []
    for entry in entries:
        kinds: frozenset[str] = frozenset()
        url = entry
        if _KINDS.match(entry):
            prefix, url = entry.split("=", 1)
            kinds = frozenset(prefix.split(","))
            if unknown := sorted(kinds - known):
                raise InvalidTarget(
                    f"LUMASTRA_NOTIFY_URLS: unknown kinds {unknown}; known: {sorted(known)}"
                )
        if apprise.Apprise.instantiate(url) is None:
            raise InvalidTarget(
                f"LUMASTRA_NOTIFY_URLS: Apprise cannot send to the {_scheme(url)} URL given "
                "(see Apprise's list of services)"
            )
        target = Target(url, kinds, _key(url))
        if any(other.key == target.key for other in targets):
            raise InvalidTarget(f"LUMASTRA_NOTIFY_URLS: {target.shown()} is listed twice")
        targets.append(target)
    return targets
