"""Who the CLI acts as, and what it may do: the API's own permission check, under a named user.

The account is `--as USERNAME`, else LUMASTRA_CLI_USER; without one nothing is read or done.
It must exist, be active staff and hold the permission the API operation requires (view for
reads, operate for actions: `api.access.allows`, the check the API and the admin make). The
sub-commands call the API's operations with a request that carries this user, so an action
names them as its actor, and each action lands in the admin log under their name (a Django
`LogEntry`, as the console's own actions do).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest

from orchestrator.api import access, audit
from orchestrator.api.access import Access
from orchestrator.management.cli.exits import REFUSED, Failure
from orchestrator.management.cli.output import Output
from orchestrator.models import TaskHistory


@dataclass(frozen=True)
class Session:
    """What a sub-command works with: the acting user, the request the API's operations read
    them from, and where its output goes."""

    user: User
    request: HttpRequest
    out: Output

    def require(self, needed: Access) -> None:
        if not access.allows(self.user, needed):
            raise Failure(REFUSED, f"{self.user.username}: {access.refusal(needed)}")

    def audit(self, message: str, run_id: str | None = None) -> None:
        """An action in the admin log under the acting user; a run's in its history too."""
        audit.record(self.user, f"{message} (CLI)", TaskHistory if run_id else None, run_id or "")


def session(username: str | None, needed: Access, out: Output) -> Session:
    """The session of `username` (LUMASTRA_CLI_USER when None), refused unless it may do what
    `needed` covers."""
    name = (username or settings.CONFIG.cli_user).strip()
    if not name:
        raise Failure(REFUSED, "no acting user: give --as USERNAME or set LUMASTRA_CLI_USER")
    user = User._default_manager.filter(username=name).first()
    if user is None:
        raise Failure(REFUSED, f"no user {name!r}")
    if not (user.is_active and user.is_staff):
        raise Failure(REFUSED, f"{name} is not an active staff account; the CLI acts only as one")
    request = HttpRequest()
    request.user = user
    request.auth = user  # type: ignore[attr-defined]  # where the API's operations read it
    found = Session(user, request, out)
    found.require(needed)
    return found
