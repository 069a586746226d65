"""LUMASTRA_NAMESPACE: set, it is taken as given; empty, it is `db<N>` of VALKEY_URL's DB."""

from __future__ import annotations

import pytest

from lumastra import config
from lumastra.config import ConfigError


@pytest.mark.parametrize(
    ("url", "namespace"),
    [
        ("redis://127.0.0.1:6379/13", "db13"),
        ("rediss://:secret@valkey.internal:6380/2", "db2"),
        ("redis://valkey.internal:6379/?db=7", "db7"),
        ("unix:///run/valkey.sock?db=3", "db3"),
        ("redis://valkey.internal:6379", "db0"),  # no DB: Valkey's DB 0
    ],
)
def test_the_default_is_the_coordination_valkeys_db(url: str, namespace: str) -> None:
    assert config.load({"VALKEY_URL": url}).namespace == namespace


def test_a_namespace_set_wins_over_the_db() -> None:
    found = config.load({"VALKEY_URL": "redis://h:6379/4", "LUMASTRA_NAMESPACE": " staging "})

    assert found.namespace == "staging"


@pytest.mark.parametrize("bad", ["a:b", "a*", "-lead", "x" * 65, "two words"])
def test_a_namespace_that_could_not_begin_a_channel_name_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="LUMASTRA_NAMESPACE"):
        config.load({"LUMASTRA_NAMESPACE": bad})


def test_a_valkey_url_without_a_db_to_read_is_refused_only_when_the_namespace_is_derived() -> None:
    with pytest.raises(ConfigError, match=r"VALKEY_URL=.*LUMASTRA_NAMESPACE"):
        config.load({"VALKEY_URL": "valkey.internal:6379"})

    named = {"VALKEY_URL": "valkey.internal:6379", "LUMASTRA_NAMESPACE": "prod"}
    assert config.load(named).namespace == "prod"
