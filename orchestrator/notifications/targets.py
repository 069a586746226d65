"""Where notifications go: LUMASTRA_NOTIFY_URLS, Apprise URLs separated by spaces, each one
optionally limited to some kinds with Apprise's own tag syntax, `dead_letter,circuit_open=URL`.

A target is known by `key`, a digest of its URL: a notification records the keys that took it
(so a retry sends to the others) without keeping a URL's credentials in Postgres. A URL that
changes is a new target. Apprise is imported here only, by the worker role's loops process
that sends.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.models import NotificationKind

_KINDS = re.compile(r"^[a-z_]+(,[a-z_]+)*=")


class InvalidTarget(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    url: str
    kinds: frozenset[str]  # empty: every kind
    key: str

    def wants(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds

    def shown(self) -> str:
        """The URL with its secrets masked (Apprise's privacy form), for logs and pages."""
        import apprise

        plugin = apprise.Apprise.instantiate(self.url)
        return str(plugin.url(privacy=True)) if plugin else "(invalid URL)"  # type: ignore[no-untyped-call]


def parse(entries: Iterable[str]) -> list[Target]:
    """The targets of LUMASTRA_NOTIFY_URLS's entries; raises InvalidTarget naming the entry
    whose kind is unknown or whose URL Apprise cannot send to."""
    import apprise

    known = set(NotificationKind.values)
    targets = []
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
                f"LUMASTRA_NOTIFY_URLS: Apprise cannot send to {url.split('://', 1)[0]}:// "
                "URLs like the one given (see Apprise's list of services)"
            )
        targets.append(Target(url, kinds, hashlib.sha256(url.encode()).hexdigest()[:16]))
    return targets
