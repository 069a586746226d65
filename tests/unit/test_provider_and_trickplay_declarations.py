"""`define_provider` and `define_trickplay` check each option and name it; the registry refuses
two providers with one id, a provider naming a limit nobody declared, a second trickplay provider
and one whose task is not registered."""

from __future__ import annotations

from typing import Any

import pytest

from tasks import NoInput, define_limit, define_provider, define_task, define_trickplay
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


def _trickplay(**options: Any) -> Any:
    declared: dict[str, Any] = {
        "task": "thumbs",
        "folder": lambda item_id: f"/tmp/{item_id}",
        "eligible": lambda item_id: True,
        "input_for": lambda item_id: {"item_id": item_id},
        "key_for": lambda item_id: f"thumbs:{item_id}",
        **options,
    }
    return define_trickplay(**declared)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"task": ""}, "field 'task'"),
        ({"folder": "/tmp"}, "field 'folder'"),
        ({"eligible": True}, "field 'eligible'"),
        ({"input_for": {}}, "field 'input_for'"),
        ({"key_for": "coverage"}, "field 'key_for'"),
        ({"index": "index.txt"}, "field 'index'"),
        ({"index": "../index.vtt"}, "field 'index'"),
    ],
)
def test_each_bad_trickplay_option_is_named(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ManifestError, match=problem):
        _trickplay(**options)


def test_the_registry_holds_one_trickplay_provider_of_a_registered_task() -> None:
    task = define_task(id="thumbs", resource_class="cpu", execute=lambda ctx, p: None,
                       input_model=NoInput)  # fmt: skip
    assert Registry([task]).trickplay is None
    one = _trickplay()
    assert Registry([task], trickplay=[one]).trickplay is one
    with pytest.raises(RegistryError, match="a second trickplay provider"):
        Registry([task], trickplay=[one, _trickplay()])
    with pytest.raises(RegistryError, match="'thumbs' is not a registered task"):
        Registry([], trickplay=[one])
