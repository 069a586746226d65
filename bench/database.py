"""A bench script's own database: made if missing, migrated, and Django set up on it, so a
script that loads a million rows never touches the app's or the tests' data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def own_database(env: dict[str, str]) -> None:
    """Point this process at `env`'s stores (DATABASE_URL its own database), create and
    migrate the database, and set up Django; exits with the preflight's words if Postgres is
    not there."""
    os.chdir(ROOT)
    os.environ.update(env)
    from lumastra import preflight

    problem = preflight.check_postgres(env["DATABASE_URL"], create=True)
    if problem:
        sys.exit(problem)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0", "--skip-checks"],
        check=True,
    )
    import django

    django.setup()
