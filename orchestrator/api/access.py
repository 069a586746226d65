"""Who may do what: the two permissions every API operation and every admin page checks.

- **view** (`orchestrator.view_taskhistory`, Django's own view permission on runs): read runs,
  tasks and their admission status, dead letters, schedules, the nodes and leader seat.
- **operate** (`orchestrator.operate_taskhistory`): start, cancel (or kill) and retry (or
  resume) runs, force-enable a task's circuit, requeue dead letters, replay or discard poison
  entries, switch schedules.

Operate does not imply view: the "Lumastra operators" group (migration 0008) holds both,
"Lumastra viewers" holds view only. A superuser holds every permission. Either counts only for
an active staff account: the API and the admin are not open to anyone else. `allows` is the one
check; the API's bearer and session authentication and the admin's pages and actions all call it.
"""

from __future__ import annotations

from enum import Enum

from django.contrib.auth.models import AnonymousUser, User

VIEWERS = "Lumastra viewers"
OPERATORS = "Lumastra operators"


class Access(Enum):
    VIEW = "view"  # read runs, tasks, nodes
    OPERATE = "operate"  # start, cancel, retry, force-enable

    @property
    def codename(self) -> str:
        return f"{self.value}_taskhistory"

    @property
    def permission(self) -> str:
        return f"orchestrator.{self.codename}"


def allows(user: User | AnonymousUser, access: Access) -> bool:
    """Whether `user` may do what `access` covers, here or in the admin."""
    return bool(user.is_active and user.is_staff and user.has_perm(access.permission))


def refusal(access: Access) -> str:
    """What a refused caller is told."""
    return f"this needs the {access.value} permission ({access.permission})"
