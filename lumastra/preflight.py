"""Checks the configuration, PostgreSQL and Valkey before the system starts, and creates the
database if missing.

`python -m lumastra.preflight` prints what is wrong and how to put it right, then exits 1 — no
traceback: a variable whose value cannot be used, a required variable the role starting
(`--role`) lacks, a service that is unreachable (at which address, how to start it).
`--check-only` never creates anything. It refuses a coordination Valkey that may evict keys or
keeps nothing on disk (`check_coordination_valkey`). `--role <role>` is what each role script
runs first (`deploy/python.sh`): that role's variables and the coordination Valkey's settings,
no other service (the role retries its stores itself). `--variables-only` checks the
variables alone. It also names the programs registered tasks run (`requires_commands`) that
are not installed: a warning, not a failure, since every other task still works.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections import defaultdict
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import redis
from psycopg2 import sql

from coverage import config as coverage_config
from lumastra import config

START_POSTGRES = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
START_VALKEY = 'redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no'


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or ''}".rstrip(":")


def check_postgres(url: str, create: bool) -> str | None:
    parts = urlsplit(url)
    database = parts.path.lstrip("/")
    server_url = urlunsplit(parts._replace(path="/postgres"))
    try:
        conn = psycopg2.connect(server_url, connect_timeout=3)
    except psycopg2.OperationalError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "no answer"
        return (
            f"PostgreSQL is not reachable at {_where(url)} ({first_line}).\n"
            f"  Start it with: {START_POSTGRES}\n  or set DATABASE_URL."
        )
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
            if cursor.fetchone() is None:
                if not create:
                    return None  # the test runner creates its own database
                cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
                print(f"created database {database!r} at {_where(url)}")
    finally:
        conn.close()
    return None


def check_valkey(name: str, url: str) -> str | None:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        return (
            f"Valkey/Redis ({name}) is not reachable at {_where(url)} ({exc}).\n"
            f"  Start it with: {START_VALKEY}\n  or set {name}."
        )
    return None


def check_coordination_valkey(url: str, *, allow_volatile: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the coordination Valkey's own settings. It holds the claims,
    locks, identity keys and (in the compose file) the broker's messages: a key it evicts
    under memory pressure, or loses in a restart, is a run executed twice or a message lost,
    so it must run with `maxmemory-policy noeviction` and with persistence (an append-only
    file, or snapshots). LUMASTRA_ALLOW_VOLATILE_VALKEY turns the problems into warnings (a
    development machine's throwaway server). An unreachable server, or one whose CONFIG
    command is disabled (some hosted ones), is a warning: the role retries its stores itself."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=3, socket_timeout=3, decode_responses=True
        )
        settings: dict[str, str] = {}
        for name in ("maxmemory-policy", "appendonly", "save"):
            settings.update(cast(dict[str, str], client.config_get(name)))
        policy = settings.get("maxmemory-policy", "")
        persisted = settings.get("appendonly") == "yes" or bool(settings.get("save", "").strip())
    except redis.ResponseError as exc:
        return [], [
            f"the coordination Valkey at {_where(url)} does not show its settings ({exc}): "
            "make sure it runs with maxmemory-policy noeviction and persistence."
        ]
    except redis.RedisError as exc:
        return [], [f"the coordination Valkey at {_where(url)} is not reachable yet ({exc})."]
    found = []
    if policy != "noeviction":
        found.append(
            f"the coordination Valkey at {_where(url)} may evict keys (maxmemory-policy "
            f"{policy}): a lost claim, lock or broker message runs work twice or loses it.\n"
            "  Set maxmemory-policy noeviction (deploy/valkey-coord.conf)"
        )
    if not persisted:
        found.append(
            f"the coordination Valkey at {_where(url)} keeps nothing on disk (appendonly no, "
            'save ""): a restart loses every claim, lock and queued message.\n'
            "  Set appendonly yes (deploy/valkey-coord.conf)"
        )
    if allow_volatile:
        return [], [f"{problem}: allowed by LUMASTRA_ALLOW_VOLATILE_VALKEY." for problem in found]
    override = ", or LUMASTRA_ALLOW_VOLATILE_VALKEY=true where Valkey may lose what it holds."
    return [problem + override for problem in found], []


# The Debian package that brings a program, where it is not the program's own name.
DEBIAN_PACKAGES = {"ffprobe": "ffmpeg"}


def missing_commands() -> list[str]:
    """A warning per program a registered task runs and PATH does not hold."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    from tasks import registry

    needed_by: defaultdict[str, list[str]] = defaultdict(list)
    for task_id in registry.get():
        for program in registry.get()[task_id].requires_commands:
            needed_by[program].append(task_id)
    return [
        f"{program} is not installed: runs of {', '.join(sorted(tasks))} fail until it is.\n"
        f"  On Debian: apt-get install {DEBIAN_PACKAGES.get(program, program)}"
        for program, tasks in sorted(needed_by.items())
        if shutil.which(program) is None
    ]


def check_variables(role: str | None, environ: Mapping[str, str]) -> int:
    """1 after naming each unusable value and, for a `role` about to start, each required
    variable it lacks; 0 when there is none. Without a role (`make run`, `make test`) the
    values alone are checked: each role script checks its own required ones."""
    problems = []
    for load in (config.load, coverage_config.load):
        try:
            load(environ)
        except config.ConfigError as exc:
            problems.append(f"configuration error: {exc}")
    if role is not None:
        problems += [
            f"{var.name} is required by the {role} role and is not set: {var.help}.\n"
            "  See docs/environment.md."
            for var in config.missing_required(role, environ)
        ]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check-only", action="store_true", help="create nothing")
    parser.add_argument(
        "--role",
        choices=config.env.ROLES,
        help="a role is starting: check its variables and the coordination Valkey's settings",
    )
    parser.add_argument(
        "--variables-only", action="store_true", help="check the variables, touch no service"
    )
    args = parser.parse_args(argv)
    failed = check_variables(args.role, os.environ)
    if failed or args.variables_only:
        return failed
    cfg = config.current()
    problems, warnings = check_coordination_valkey(
        cfg.valkey_url, allow_volatile=cfg.allow_volatile_valkey
    )
    if args.role is None:  # `make run`, `make test`: every store must answer now
        checked = (
            check_postgres(cfg.database_url, create=not args.check_only),
            check_valkey("VALKEY_URL", cfg.valkey_url),
            check_valkey("CELERY_BROKER_URL", cfg.celery_broker_url),
        )
        if unreachable := [found for found in checked if found]:
            problems, warnings = unreachable, []
        elif not problems:
            warnings += missing_commands()
    elif args.role == "worker" and not problems:
        # The role that runs the commands says which are missing as it starts (its log).
        warnings += missing_commands()
    for problem in problems:
        print(problem, file=sys.stderr)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
