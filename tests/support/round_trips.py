"""Counts what one piece of code sends to Postgres, Valkey and the broker, and where from.

Observation only, at the libraries' own seams: Postgres through Django's `execute_wrapper`
(every statement a cursor runs, savepoints included) plus the connection's commit, rollback and
health check, which bypass cursors; Redis (the coordination Valkey and a Redis broker alike)
through redis-py's `send_packed_command`, the one call that writes to the socket, so a
pipeline is one round trip carrying several commands. Nothing of ours is replaced.

Only the calling thread is counted: the run-watch thread's ticks (its Valkey heartbeat, the
log and progress flushes) may fall before or after a no-op handler ends (they are listed
apart, in `other_threads`). redis-py's periodic PING health check is left out for the same
reason: it depends on how long a connection sat idle, not on the code measured.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg2.extensions import TRANSACTION_STATUS_IDLE

from orchestrator.stores import valkey

ROOT = Path(__file__).resolve().parents[2]
_PROJECT = tuple(str(ROOT / package) + "/" for package in ("orchestrator", "tasks", "lumastra"))
_RUN_ID = re.compile(r"run_[0-9A-Z]{26}")
_SQL_COMMENT = re.compile(r"--[^\n]*")
_SELECT_LIST = re.compile(r"^SELECT .+? FROM ", re.DOTALL)
_ASYNC_COMMIT = "synchronous_commit = off"
# A statement that writes; the three prepared ones (`stores.queries`) all do.
_WRITE = re.compile(
    r"^\s*(SET LOCAL [^;]*;\s*)?(INSERT|UPDATE|DELETE|MERGE|EXECUTE|PREPARE)\b", re.IGNORECASE
)


class Counts(NamedTuple):
    """Round trips of one path, by store. A pipeline is one Valkey round trip of n commands."""

    postgres: int
    valkey: int
    valkey_commands: int
    broker: int
    broker_commands: int
    # Commits that wait for their WAL flush: the explicit COMMITs, and the writes sent in
    # autocommit (each its own transaction), except those that turn synchronous_commit off.
    sync_commits: int


@dataclass(frozen=True)
class Event:
    store: str  # "postgres", "valkey", "cache" or "broker"
    what: str  # the statement or the commands of one round trip, shortened
    commands: int  # commands in the round trip (1 but for a pipeline)
    step: str  # the innermost project frames that sent it


@dataclass
class Recording:
    events: list[Event] = field(default_factory=list)
    other_threads: list[Event] = field(default_factory=list)
    sync_commits: int = 0

    def counts(self) -> Counts:
        def of(store: str) -> list[Event]:
            return [e for e in self.events if e.store == store]

        return Counts(
            postgres=len(of("postgres")),
            valkey=len(of("valkey")),
            valkey_commands=sum(e.commands for e in of("valkey")),
            broker=len(of("broker")),
            broker_commands=sum(e.commands for e in of("broker")),
            sync_commits=self.sync_commits,
        )

    def steps_table(self) -> str:
        """Markdown: one row per round trip, in order."""
        lines = ["| # | store | step | sent |", "|---|---|---|---|"]
        for number, event in enumerate(self.events, 1):
            sent = event.what.replace("|", "\\|")
            lines.append(f"| {number} | {event.store} | `{event.step}` | `{sent}` |")
        for event in self.other_threads:
            lines.append(f"| (watch thread) | {event.store} | `{event.step}` | `{event.what}` |")
        return "\n".join(lines)


def _step() -> str:
    """The two innermost project frames of the stack: `runner._claim_durable > durable.claim`."""
    names = [
        f"{Path(frame.filename).stem}.{frame.name}"
        for frame in traceback.extract_stack()
        if frame.filename.startswith(_PROJECT)
    ]
    return " > ".join(names[-2:]) or "(outside the project)"


def _sql(text: str) -> str:
    text = " ".join(_SQL_COMMENT.sub("", text).split())
    text = _SELECT_LIST.sub("SELECT … FROM ", text)
    return text if len(text) <= 110 else text[:107] + "…"


def _script_names() -> dict[str, str]:
    return {
        hashlib.sha1(valkey.script_source(path.stem).encode()).hexdigest(): path.stem
        for path in valkey.LUA_DIR.glob("*.lua")
    }


def _decode(packed: Any) -> list[list[str]]:
    """The commands in one RESP write: arrays of bulk strings."""
    if isinstance(packed, (bytes, str, memoryview)):
        packed = [packed]
    data = b"".join(bytes(p) if not isinstance(p, str) else p.encode() for p in packed)
    commands, at = [], 0
    while at < len(data):
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        args = []
        for _ in range(count):
            end = data.index(b"\r\n", at)
            size = int(data[at + 1 : end])
            args.append(data[end + 2 : end + 2 + size].decode(errors="replace"))
            at = end + 2 + size + 2
        commands.append(args)
    return commands


def _describe(command: list[str], script_names: dict[str, str]) -> str:
    name = command[0].upper()
    if name == "EVALSHA":
        return f"EVALSHA {script_names.get(command[1], command[1][:8])}"
    if name == "EVAL":
        sha = hashlib.sha1(command[1].encode()).hexdigest()
        return f"EVAL {script_names.get(sha, '(inline)')}"
    key = _RUN_ID.sub("<runId>", command[1]) if len(command) > 1 else ""
    return f"{name} {key}".strip()


def _round_trip(sent: list[list[str]], script_names: dict[str, str]) -> str:
    """One command as `NAME key`; a pipeline as its commands, a run of one name folded
    (`pipeline: LLEN x115` for a depth check over many queues)."""
    if len(sent) == 1:
        return _describe(sent[0], script_names)

    def kind(command: list[str]) -> str:
        # Scripts by name; other commands by name alone, whatever their keys.
        if command[0].upper() in ("EVALSHA", "EVAL"):
            return _describe(command, script_names)
        return command[0].upper()

    groups = [list(g) for _, g in itertools.groupby(sent, key=kind)]
    parts = [
        _describe(group[0], script_names) if len(group) == 1 else f"{kind(group[0])} x{len(group)}"
        for group in groups
    ]
    return f"pipeline: {', '.join(parts)}"


def _stores() -> dict[tuple[int, int], str]:
    """(port, db) of each Redis the settings name, to tell the coordination Valkey from the
    cache and the broker."""
    found = {}
    for store, url in (
        ("valkey", settings.CONFIG.valkey_url),
        ("cache", settings.CONFIG.valkey_cache_url),
        ("broker", settings.CONFIG.celery_broker_url),
    ):
        if url.startswith("redis"):
            options = redis.connection.parse_url(url)
            found.setdefault((options.get("port", 6379), options.get("db", 0)), store)
    return found


@contextmanager
def recording() -> Iterator[Recording]:
    """Everything the calling thread sends to Postgres (Django's default connection) and to
    any Redis, while the block runs."""
    caught = Recording()
    # The wrapper itself, not django.db.connection: that proxy would keep our attributes.
    connection = connections[DEFAULT_DB_ALIAS]
    caller = threading.get_ident()
    script_names = _script_names()
    stores = _stores()

    def note(store: str, what: str, commands: int = 1) -> None:
        event = Event(store, what, commands, _step())
        if threading.get_ident() == caller:
            caught.events.append(event)
        else:
            caught.other_threads.append(event)

    def in_transaction() -> bool:
        raw = connection.connection
        return raw is not None and raw.get_transaction_status() != TRANSACTION_STATUS_IDLE

    async_transaction = False

    def statement(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal async_transaction
        # psycopg2 sends BEGIN by itself before the first statement outside autocommit.
        if not connection.connection.autocommit and not in_transaction():
            note("postgres", "BEGIN")
            async_transaction = False
        note("postgres", _sql(sql))
        unwaited = _ASYNC_COMMIT in sql
        if connection.connection.autocommit:
            # Its own transaction: a write commits (and waits for its flush) at once.
            bare = _SQL_COMMENT.sub("", sql)
            if threading.get_ident() == caller and _WRITE.match(bare) and not unwaited:
                caught.sync_commits += 1
        else:
            async_transaction = async_transaction or unwaited
        return execute(sql, params, many, context)

    # Instance attributes over the connection's own methods: psycopg2 sends COMMIT or
    # ROLLBACK only inside a transaction, and Django's health check runs its SELECT 1 on the
    # raw connection, so neither passes through the execute wrapper.
    commit, rollback, is_usable = connection.commit, connection.rollback, connection.is_usable

    def counted_commit() -> None:
        if in_transaction():
            note("postgres", "COMMIT")
            if threading.get_ident() == caller and not async_transaction:
                caught.sync_commits += 1
        commit()

    def counted_rollback() -> None:
        if in_transaction():
            note("postgres", "ROLLBACK")
        rollback()

    def counted_is_usable() -> bool:
        note("postgres", "SELECT 1 (Django's connection health check)")
        return is_usable()

    send = redis.connection.AbstractConnection.send_packed_command

    def counted_send(self: Any, command: Any, check_health: bool = True) -> None:
        # Sent first, noted after: a new connection's handshake (HELLO, SELECT...) goes out
        # from inside this call and belongs before the command that needed it.
        send(self, command, check_health)
        sent = _decode(command)
        if [c[0].upper() for c in sent] != ["PING"]:
            store = stores.get((self.port, self.db), f"redis :{self.port}/{self.db}")
            note(store, _round_trip(sent, script_names), len(sent))

    connection.commit, connection.rollback = counted_commit, counted_rollback  # type: ignore[method-assign]
    connection.is_usable = counted_is_usable  # type: ignore[method-assign]
    redis.connection.AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(statement):
            yield caught
    finally:
        redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        for name in ("commit", "rollback", "is_usable"):
            delattr(connection, name)
