"""Loads the Lua scripts under `lua/` and pins their versions.

Each script is registered with redis-py (`register_script`, for its SHA) and sent as EVALSHA,
falling back to EVAL on NOSCRIPT, so a `SCRIPT FLUSH` or a restarted Valkey costs one extra
round trip. A changed
script gets a new version here and in its header; a unit test checks the two agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from orchestrator.stores import valkey

LUA_DIR = Path(__file__).parent / "lua"
PINNED_VERSIONS = {
    "seed_run": 2,
    "claim_run": 4,
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
    "concurrency_refresh": 1,
    "rate_take": 1,
    "lock_renew": 1,
    "lock_release": 1,
    "drain_push": 1,
    "drain_unpoison": 1,
    "broker_run_ids": 1,
}
_VERSION = re.compile(r"^-- @version (\d+)$", re.MULTILINE)


def header_version(source: str) -> int | None:
    match = _VERSION.search(source)
    return int(match.group(1)) if match else None


def source(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text()


@cache
def _script(name: str) -> Script:
    text = source(name)
    if header_version(text) != PINNED_VERSIONS[name]:
        raise RuntimeError(f"lua/{name}.lua header does not match pinned version")
    return valkey.client().register_script(text)


def call(name: str, keys: list[str], args: list[Any], client: Redis | None = None) -> Any:
    """Run a script on the coordination Valkey (on this thread's own connection,
    `valkey.command`), or on `client` (e.g. the broker)."""
    script = _script(name)
    if client is not None:
        return script(keys=keys, args=args, client=client)
    try:
        return valkey.command("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        # Valkey restarted or flushed its scripts: EVAL runs it and caches it again.
        return valkey.command("EVAL", script.script, len(keys), *keys, *args)


def queue(pipe: Pipeline, name: str, keys: list[str], args: list[Any]) -> None:
    """Add a script call to `pipe` (EVALSHA) to be sent with the pipeline's other commands.

    Not `register_script(...)(client=pipe)`: redis-py then asks SCRIPT EXISTS before every
    pipeline, a round trip of its own. A NOSCRIPT reply is answered by `replied` instead.
    """
    pipe.evalsha(_script(name).sha, len(keys), *keys, *args)


def call_with(
    name: str, keys: list[str], args: list[Any], also: Callable[[Pipeline], object]
) -> Any:
    """A script call and the commands `also` adds to its pipeline, in one round trip; the
    script's reply (NOSCRIPT answered as `replied` does; the other commands' replies are not
    read)."""
    pipe = valkey.client().pipeline(transaction=False)
    queue(pipe, name, keys, args)
    also(pipe)
    reply, *_ = valkey.execute(pipe, raise_on_error=False)
    return replied(name, keys, args, reply)


def replied(name: str, keys: list[str], args: list[Any], reply: Any) -> Any:
    """The reply of a call `queue`d in a pipeline executed with errors as values: NOSCRIPT
    (Valkey restarted or flushed its scripts: the call did not run) runs it again here,
    loading the script; any other error is raised."""
    if isinstance(reply, NoScriptError):
        return call(name, keys, args)
    if isinstance(reply, Exception):
        raise reply
    return reply
