"""Metadata providers (issue 41): a call is cached, fetched under its circuit, limits and
timeout, answered from an older cached answer when the remote fails; the Providers page and
`GET /api/v1/providers` show calls, errors, latency and the circuit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from orchestrator import providers
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.clock import FrozenClock
from orchestrator.hooks import limits
from orchestrator.models import Notification, TaskCircuitState
from orchestrator.stores import counters, keys, valkey
from orchestrator.stores.cache import client as cache_client
from tasks import ProviderUnavailable, registry
from tasks import providers as sdk
from tasks.providers import UnknownProvider
from tests.support.provider_defs import REMOTE_KEY
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    def clean() -> None:
        coordination = valkey.client()
        coordination.delete(REMOTE_KEY, keys.metrics(counters.PROVIDER_CALLS))
        for provider_id in registry.get().providers:
            coordination.delete(
                keys.circuit(providers.owner(provider_id)), keys.provider_latency(provider_id)
            )
        for key in cache_client().scan_iter(match=keys.provider_answer("test-*", "*")):
            cache_client().delete(key)

    clean()
    yield
    clean()


def _remote(mode: str) -> None:
    valkey.client().hset(REMOTE_KEY, "mode", mode)


def _fetches() -> int:
    return int(valkey.client().hget(REMOTE_KEY, "fetches") or 0)


def test_a_failing_remote_opens_the_circuit_and_cached_answers_are_still_served() -> None:
    clock = FrozenClock(timezone.now())
    assert sdk.call("test-remote", {"q": "a"}) == {"q": "a", "fetch": 1}
    assert providers.call("test-remote", {"q": "a"}, clock=clock) == {"q": "a", "fetch": 1}
    assert _fetches() == 1  # the second came from the cache

    clock.advance(timedelta(seconds=61))  # "a"'s answer is past its cache_s, still kept
    _remote("fail")
    for n in range(5):
        with pytest.raises(ProviderUnavailable, match="ConnectionError: the remote answered 503"):
            providers.call("test-remote", {"q": f"new-{n}"}, clock=clock)
    # Open: a call is not even fetched; one with an older answer gets it.
    with pytest.raises(ProviderUnavailable, match="provider 'test-remote' refused: its circuit"):
        providers.call("test-remote", {"q": "new-5"}, clock=clock)
    assert providers.call("test-remote", {"q": "a"}, clock=clock) == {"q": "a", "fetch": 1}
    assert _fetches() == 6

    (found,) = [p for p in providers.overview(clock=clock) if p.id == "test-remote"]
    assert found.circuit.state == "open" and found.circuit.consecutive_failures == 5
    assert found.calls == {"fetched": 1, "cached": 1, "failed": 6, "stale": 1}
    assert found.errors == 7
    assert found.p50_ms is not None and found.p95_ms is not None
    assert TaskCircuitState.objects.get(task_id="provider:test-remote").state == "open"
    (told,) = Notification.objects.filter(kind="circuit_open")
    assert told.subject == "provider:test-remote"

    # Past its first backoff the circuit lets one call probe; the remote is back: closed.
    _remote("ok")
    clock.advance(timedelta(minutes=1, seconds=1))
    assert providers.call("test-remote", {"q": "b"}, clock=clock)["q"] == "b"
    (found,) = [p for p in providers.overview(clock=clock) if p.id == "test-remote"]
    assert found.circuit.state == "closed"


def test_a_fetch_past_its_timeout_and_a_limit_without_a_place_give_no_answer() -> None:
    with pytest.raises(ProviderUnavailable, match=r"no answer within 0\.2 s"):
        providers.call("test-slow", {})
    held = [limits.Held(registry.get().limits["test-provider-place"], "")]
    assert limits.take(held, "someone-else", 1, timedelta(minutes=1), "someone-else").taken
    try:
        with pytest.raises(ProviderUnavailable, match=r"had no place within 0\.3 s"):
            providers.call("test-limited", {"q": "x"})
        assert _fetches() == 0
    finally:
        limits.give_back(held, "someone-else", 1, admissions=True)
    assert providers.call("test-limited", {"q": "x"}) == {"q": "x", "fetch": 1}
    # Its place is given back: another call takes it at once.
    assert providers.call("test-limited", {"q": "y"}) == {"q": "y", "fetch": 2}


def test_an_unknown_provider_and_a_query_that_is_not_json_are_refused() -> None:
    with pytest.raises(UnknownProvider, match="unknown provider 'nope'"):
        providers.call("nope", {})
    with pytest.raises(ValueError, match="must be a JSON object"):
        providers.call("test-remote", ["q"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not JSON"):
        providers.call("test-remote", {"q": object()})
    assert _fetches() == 0


def test_the_page_and_the_api_show_each_provider() -> None:
    _remote("fail")
    with pytest.raises(ProviderUnavailable):
        providers.call("test-remote", {"q": "a"})
    viewer = Client()
    account("viewer", Access.VIEW)
    viewer.login(username="viewer", password=PASSWORD)

    page = viewer.get("/admin/orchestrator/taskhistory/providers/")

    assert page.status_code == 200
    row = page.content.decode().split('id="provider-test-remote"')[1].split("</tr>")[0]
    assert "closed" in row and '<td class="errors">1</td>' in row
    api = Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})
    listed = {p["id"]: p for p in api.get("/api/v1/providers").json()}
    assert {"test-remote", "test-slow", "test-limited", "metadata"} <= set(listed)
    assert listed["test-remote"]["calls"] == {"failed": 1}
    assert listed["test-remote"]["circuit"]["consecutive_failures"] == 1
    assert listed["test-limited"]["limits"] == ["test-provider-place"]
    assert Client().get("/api/v1/providers").status_code == 401
