"""`manage.py create_api_token <username> [--name N]`: print a new API token, once.

The token goes to stdout alone (so `TOKEN=$(manage.py create_api_token admin)` works); the
advice goes to stderr. Only the token's digest is stored: a lost token cannot be recovered,
only replaced.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError

from orchestrator.api import tokens


class Command(BaseCommand):
    help = "Create an API bearer token for a user and print it (shown only this once)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label to tell tokens apart")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        try:
            user = User._default_manager.get_by_natural_key(username)
        except User.DoesNotExist:
            raise CommandError(
                f"no user {username!r}; create one first (manage.py createsuperuser)"
            ) from None
        record, token = tokens.issue(user, name)
        self.stdout.write(token)
        self.stderr.write(
            f"Created token {record.prefix}… for {username}. "
            "Store it now: it cannot be shown again."
        )
        if not (user.is_active and user.is_staff):
            self.stderr.write(
                f"Warning: {username} is not active staff; the API answers 403 to this token "
                "until they are."
            )
