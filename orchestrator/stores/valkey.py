"""The coordination Valkey: its client, one connection pool per process (fork-safe in redis-py),
a thread's own connection for the commands every run sends, and the Lua scripts under `lua/`.

Each script is registered with redis-py (`register_script`, for its SHA) and sent as EVALSHA,
falling back to EVAL on NOSCRIPT, so a `SCRIPT FLUSH` or a restarted Valkey costs one extra
round trip. A changed script gets a new version here and in its header; a unit test checks
the two agree.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

import redis
import redis.asyncio
from django.conf import settings
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from orchestrator.clock import EPOCH

# How long a handler's own thread sends nothing more to Valkey after a send failed or was slow
# (`HandlerSends`).
OUTAGE_PAUSE_S = 10.0
# A send slower than this says the path is bad, as a failed one does: on a lossy link a send
# waits out the kernel's retransmissions (200 ms and more each) and still arrives, up to the
# store timeout later, so a handler that reports in small steps would spend its time there.
SLOW_SEND_S = 0.25

T = TypeVar("T")


class HandlerSends:
    """The gate on what a handler's own thread sends to Valkey beside its work: its cancel
    check and its inline log and progress flushes, one gate for the run's attempt. After a
    send failed, or took longer than SLOW_SEND_S, the gate stays shut for OUTAGE_PAUSE_S and
    the watch's threads send meanwhile: a store that went away, or a lossy link, costs the
    handler one send per pause, not one per line or report."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._shut_until = 0.0

    @property
    def open(self) -> bool:
        return self._monotonic() >= self._shut_until

    def send(self, call: Callable[[], T]) -> T:
        started = self._monotonic()
        try:
            result = call()
        except Exception:
            self._shut_until = self._monotonic() + OUTAGE_PAUSE_S
            raise
        if self._monotonic() - started > SLOW_SEND_S:
            self._shut_until = self._monotonic() + OUTAGE_PAUSE_S
        return result


def _options() -> dict[str, Any]:
    # A connection whose path went dead (a partition) fails within the store timeout instead
    # of hanging its thread until the kernel gives up (`lumastra/settings.py` does the same
    # for Postgres). A pub/sub wait with its own timeout is not cut by it.
    timeout = settings.CONFIG.store_timeout_s
    return {
        "decode_responses": True,
        "health_check_interval": 30,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "socket_keepalive": True,
    }


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.CONFIG.valkey_url, **_options())


_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
    weakref.WeakKeyDictionary()
)


def async_client() -> redis.asyncio.Redis:
    """A client for the running event loop (the web role's ASGI loop: event streams), one pool
    per loop, as an asyncio connection cannot move between loops."""
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is None:
        found = redis.asyncio.Redis.from_url(settings.CONFIG.valkey_url, **_options())
        _async_clients[loop] = found
    return found


_held = threading.local()


def command(*args: Any) -> Any:
    """One command on this thread's own connection to the coordination Valkey, its reply
    (errors raised, as `client()` raises them). What `client().execute_command` does without
    taking a connection from the pool and giving it back on every call: the scripts every run
    sends (its claim, its end) pay that twice per run. As the pool does, a connection the
    server closed since its last use (a restart, an idle timeout) is connected again before
    the command; a command cut short by anything (a timeout, Celery's soft time limit) drops
    the connection, so no reply is ever left unread for the next one."""
    pid = os.getpid()
    conn = getattr(_held, "conn", None)
    if conn is None or _held.pid != pid:  # a forked child never shares its parent's socket
        pool = client().connection_pool
        conn = _held.conn = pool.connection_class(**pool.connection_kwargs)
        _held.pid = pid
    try:
        try:
            stale = conn.can_read()  # connects it if needed; readable at rest: closed
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            stale = True  # closed by the server, found so by the read
        if stale:
            conn.disconnect()
        conn.send_command(*args)
        return conn.read_response()
    except redis.ResponseError:
        raise  # an error reply read whole: the connection is as good as before
    except BaseException:
        conn.disconnect()
        raise


def execute(pipe: Pipeline, *, raise_on_error: bool = True) -> list[Any]:
    """Send a pipeline's commands; their replies, in order (errors as values when
    `raise_on_error` is False). The one typed place for redis-py's untyped `execute`."""
    return cast(list[Any], pipe.execute(raise_on_error=raise_on_error))  # type: ignore[no-untyped-call]


def to_ms(moment: datetime) -> int:
    """Milliseconds since the epoch: how Valkey hashes and Lua scripts hold moments."""
    return int(moment.timestamp() * 1000)


def from_ms(ms: int | str) -> datetime:
    return EPOCH + timedelta(milliseconds=int(ms))


def time_ms(reply: tuple[int | str, int | str]) -> int:
    """Valkey's TIME reply (seconds, microseconds) in milliseconds, as Lua scripts compute it."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


LUA_DIR = Path(__file__).parent / "lua"
PINNED_SCRIPT_VERSIONS = {
    "seed_run": 3,
    "claim_run": 5,
    "transition_run": 4,
    "transition_stage": 3,
    "set_progress": 1,
    "log_append": 1,
    "end_run": 2,
    "identity_claim": 1,
    "identity_hold": 1,
    "shed_oldest": 1,
    "heartbeat_run": 1,
    "request_cancel": 3,
    "remove_message": 1,
    "count_delivery": 1,
    "admit_run": 1,
    "circuit_admit": 1,
    "circuit_record": 2,
    "circuit_probe": 1,
    "circuit_force": 1,
    "circuit_restore": 1,
    "concurrency_take": 1,
    "keyed": 1,
    "limit_take": 1,
    "concurrency_refresh": 1,
    "rate_take": 1,
    "lock_renew": 1,
    "lock_release": 1,
    "drain_push": 1,
    "drain_unpoison": 1,
    "broker_run_ids": 1,
}
_VERSION = re.compile(r"^-- @version (\d+)$", re.MULTILINE)


def script_version(source: str) -> int | None:
    match = _VERSION.search(source)
    return int(match.group(1)) if match else None


def script_source(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text()


@cache
def _script(name: str) -> Script:
    text = script_source(name)
    if script_version(text) != PINNED_SCRIPT_VERSIONS[name]:
        raise RuntimeError(f"lua/{name}.lua header does not match pinned version")
    return client().register_script(text)


def script(name: str, keys: list[str], args: list[Any], client: redis.Redis | None = None) -> Any:
    """Run a script on the coordination Valkey (on this thread's own connection,
    `command`), or on `client` (e.g. the broker)."""
    script = _script(name)
    if client is not None:
        return script(keys=keys, args=args, client=client)
    try:
        return command("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        # Valkey restarted or flushed its scripts: EVAL runs it and caches it again.
        return command("EVAL", script.script, len(keys), *keys, *args)


def queue_script(pipe: Pipeline, name: str, keys: list[str], args: list[Any]) -> None:
    """Add a script call to `pipe` (EVALSHA) to be sent with the pipeline's other commands.

    Not `register_script(...)(client=pipe)`: redis-py then asks SCRIPT EXISTS before every
    pipeline, a round trip of its own. A NOSCRIPT reply is answered by `script_replied` instead.
    """
    pipe.evalsha(_script(name).sha, len(keys), *keys, *args)


def script_with(
    name: str, keys: list[str], args: list[Any], also: Callable[[Pipeline], object]
) -> Any:
    """A script call and the commands `also` adds to its pipeline, in one round trip; the
    script's reply (NOSCRIPT answered as `script_replied` does; the other commands' replies are not
    read)."""
    pipe = client().pipeline(transaction=False)
    queue_script(pipe, name, keys, args)
    also(pipe)
    reply, *_ = execute(pipe, raise_on_error=False)
    return script_replied(name, keys, args, reply)


def script_replied(name: str, keys: list[str], args: list[Any], reply: Any) -> Any:
    """The reply of a call `queue_script`ed in a pipeline executed with errors as values: NOSCRIPT
    (Valkey restarted or flushed its scripts: the call did not run) runs it again here,
    loading the script; any other error is raised."""
    if isinstance(reply, NoScriptError):
        return script(name, keys, args)
    if isinstance(reply, Exception):
        raise reply
    return reply
