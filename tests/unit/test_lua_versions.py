"""Every Lua script carries a `-- @version N` header equal to its pin, and checks its arguments.

The header checks are pure; the argument checks run each script on the test Valkey (a missing
Valkey fails them, it does not skip them).
"""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from orchestrator.stores import keys, valkey

LUA_FILES = sorted(path.stem for path in valkey.LUA_DIR.glob("*.lua"))

# The argument contract of each script: (keys, fewest args, most args or None for "any more").
CONTRACTS: dict[str, tuple[int, int, int | None]] = {
    "seed_run": (3, 7, None),
    "claim_run": (4, 5, 5),
    "transition_run": (2, 4, 4),
    "transition_stage": (2, 3, 3),
    "set_progress": (1, 2, 2),
    "log_append": (2, 4, None),
    "end_run": (6, 10, None),
    "identity_claim": (1, 3, 3),
    "identity_hold": (1, 2, 2),
    "shed_oldest": (1, 2, None),
    "heartbeat_run": (1, 2, 2),
    "request_cancel": (3, 2, 2),
    "remove_message": (1, 2, 2),
    "count_delivery": (1, 1, 1),
    "admit_run": (3, 4, 4),
    "circuit_admit": (1, 3, 3),
    "circuit_record": (1, 7, None),
    "circuit_probe": (1, 2, 2),
    "circuit_force": (1, 3, 3),
    "circuit_restore": (1, 10, 10),
    "concurrency_take": (3, 5, 5),
    "keyed": (5, 5, None),
    "limit_take": (4, 10, 10),
    "concurrency_refresh": (1, 2, 2),
    "rate_take": (1, 3, 3),
    "lock_renew": (1, 2, 2),
    "lock_release": (1, 1, 1),
    "drain_push": (1, 2, 2),
    "drain_unpoison": (2, 3, 3),
    "broker_run_ids": (1, 2, 2),
}


def test_there_are_scripts() -> None:
    assert LUA_FILES


def test_every_script_is_pinned_and_every_pin_has_a_script() -> None:
    assert set(LUA_FILES) == set(valkey.PINNED_SCRIPT_VERSIONS)


@pytest.mark.parametrize("name", LUA_FILES)
def test_header_version_matches_the_pin(name: str) -> None:
    source = valkey.script_source(name)

    assert source.splitlines()[0] == f"-- @version {valkey.PINNED_SCRIPT_VERSIONS.get(name)}"
    assert valkey.script_version(source) == valkey.PINNED_SCRIPT_VERSIONS[name]


@pytest.mark.parametrize("name", LUA_FILES)
def test_header_documents_keys_and_argv(name: str) -> None:
    header = [line for line in valkey.script_source(name).splitlines() if line.startswith("--")]

    assert any("KEYS[1]" in line for line in header), name
    assert any("ARGV[1]" in line for line in header), name


def test_header_version_reads_only_a_version_line() -> None:
    assert valkey.script_version("-- @version 12\nreturn 1") == 12
    assert valkey.script_version("-- version 1\nreturn 1") is None
    assert valkey.script_version("return 1 -- @version 2") is None


def test_every_script_has_an_argument_contract_here() -> None:
    assert set(CONTRACTS) == set(LUA_FILES)


def _wrong_counts(name: str) -> list[tuple[int, int]]:
    n_keys, fewest, most = CONTRACTS[name]
    wrong = [(n_keys - 1, fewest), (n_keys + 1, fewest), (n_keys, fewest - 1), (0, 0)]
    if most is not None:
        wrong.append((n_keys, most + 1))
    return wrong


@pytest.mark.parametrize(
    ("name", "n_keys", "n_args"),
    [(name, k, a) for name in sorted(CONTRACTS) for k, a in _wrong_counts(name)],
)
def test_wrong_argument_counts_are_rejected(name: str, n_keys: int, n_args: int) -> None:
    run_id = "run_badargs"
    # One key more than the most any script takes, for the "one key too many" case.
    key_pool = [
        keys.run_active(run_id),
        keys.run_terminal(run_id),
        *(f"unused:key:{n}" for n in range(3, 8)),
    ]
    client = valkey.client()
    client.delete(*key_pool)

    with pytest.raises(ResponseError, match=f"^BAD_ARGS {name} "):
        valkey.script(name, key_pool[:n_keys], [f"arg{i}" for i in range(n_args)])

    assert client.exists(*key_pool) == 0, "a rejected call must write nothing"
