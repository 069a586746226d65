"""`define_provider` checks each option and names it; the registry refuses two providers with
one id and a provider naming a limit nobody declared."""

from __future__ import annotations

from typing import Any

import pytest

from tasks import define_limit, define_provider
from tasks.errors import ManifestError
from tasks.providers import UnknownProvider
from tasks.registry import Registry, RegistryError


def _fetch(query: dict[str, Any]) -> None:
    return None


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"id": "Bad Id"}, "field 'id'"),
        ({"fetch": "not callable"}, "field 'fetch'"),
        ({"timeout_s": 0}, "field 'timeout_s'"),
        ({"timeout_s": True}, "field 'timeout_s'"),
        ({"timeout_s": 301}, "field 'timeout_s'"),
        ({"limits": ["a-list"]}, "field 'limits'"),
        ({"cache_s": -1}, "field 'cache_s'"),
        ({"cache_s": 1.5}, "field 'cache_s'"),
    ],
)
def test_each_bad_option_is_named(options: dict[str, Any], problem: str) -> None:
    declared: dict[str, Any] = {"id": "remote", "fetch": _fetch, **options}
    with pytest.raises(ManifestError, match=problem):
        define_provider(declared.pop("id"), **declared)


def test_the_registry_refuses_a_second_provider_and_an_undeclared_limit() -> None:
    first = define_provider("remote", fetch=_fetch)
    second = define_provider("remote", fetch=_fetch, cache_s=0)
    with pytest.raises(RegistryError, match=r"provider 'remote'.*defined more than once"):
        Registry([], providers=[first, second])
    unlimited = define_provider("limited", fetch=_fetch, limits=("nowhere",))
    with pytest.raises(RegistryError, match=r"'nowhere' is not a declared limit"):
        Registry([], providers=[unlimited])

    place = define_limit("somewhere", concurrency=1)
    limited = define_provider("limited", fetch=_fetch, limits=("somewhere",))
    registry = Registry([], limits=[place], providers=[limited, first])
    assert registry.provider("limited") is limited
    with pytest.raises(UnknownProvider):
        registry.provider("nope")
