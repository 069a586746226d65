"""Accounts for permission tests: staff or not, with the view and operate permissions
(orchestrator/api/access.py) granted directly, so no test depends on the groups a data migration
made (a transactional test's flush removes them)."""

from __future__ import annotations

from django.contrib.auth.models import Permission, User

from orchestrator.api.access import Access

PASSWORD = "pw-for-tests"


def account(username: str, *grants: Access, staff: bool = True, superuser: bool = False) -> User:
    if superuser:
        return User.objects.create_superuser(username, f"{username}@example.invalid", PASSWORD)
    user = User.objects.create_user(username, password=PASSWORD, is_staff=staff)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="orchestrator", codename__in=[g.codename for g in grants]
        )
    )
    return user


def operator(username: str = "ops") -> User:
    return account(username, Access.VIEW, Access.OPERATE)
