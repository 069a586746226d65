"""`/metrics`: the token gate, the output parsed with prometheus_client's own parser, the
leader gauges, counts that follow real runs, the same cluster totals from two web processes,
and what waits on an operator (`api.metrics_live`): the roster, the drain, dead letters, each
class's queue cap and wait."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta

import pytest
import requests
from django.conf import settings
from django.db.models.functions import Now
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cluster import roster
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.hooks import costs
from orchestrator.hooks.quotas import QuotaExceeded
from orchestrator.models import DeliveryStatus, TaskHistory, WebhookDelivery
from orchestrator.routing import class_limit
from orchestrator.runs.start import new_run_id, start_run
from orchestrator.runs.wait import RunFailed
from orchestrator.states import RunState
from orchestrator.stores import cache, counters, keys, valkey
from orchestrator.triggers import TriggerKind
from orchestrator.webhooks.delivery import create_endpoint
from tests.support.runs import clean_drain
from tests.support.servers import free_port, web_process

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "metrics-token-for-tests"


@pytest.fixture(autouse=True)
def _token() -> Iterator[None]:
    # Every scrape computed (no cache), but in the tests of the cache itself.
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, metrics_token=TOKEN, metrics_cache_s=0)
    yield
    settings.CONFIG = config


def _scrape(client: Client | None = None) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return _samples(response.content.decode())


def _samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[labels] = sample.value
    return found


def test_the_token_gates_the_endpoint() -> None:
    client = Client()

    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-it")
    assert wrong.status_code == 401 and wrong["WWW-Authenticate"] == "Bearer"
    settings.CONFIG = dataclasses.replace(settings.CONFIG, metrics_token="")
    disabled = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert disabled.status_code == 404
    assert "LUMASTRA_METRICS_TOKEN" in disabled.json()["detail"]


def test_every_family_is_there_and_parses() -> None:
    samples = _scrape()

    for name in (
        "lumastra_task_queue_depth",
        "lumastra_task_active_runs",
        "lumastra_task_circuit_state",
        "lumastra_leader_seat_held",
        "lumastra_coverage_rows",
        "lumastra_coverage_oldest_due_seconds",
    ):
        assert name in samples, name
    circuit_noop = {
        labels: value
        for labels, value in samples["lumastra_task_circuit_state"].items()
        if ("task", "test-noop") in labels
    }
    assert sum(circuit_noop.values()) == 1  # exactly one state is current
    assert (("stage", "test-probe"), ("status", "pending")) in samples["lumastra_coverage_rows"]


def test_the_leader_gauges_show_the_cluster_seat_only() -> None:
    client = valkey.client()
    lock = keys.orchestrator_lock(CLUSTER)
    client.delete(lock)
    vacant = _scrape()
    client.set(lock, "hosta:1:LEADER01:ab", px=30_000)
    # A class seat, as a loops process older than their removal still renews during a
    # rolling deploy: not exported.
    client.set(keys.orchestrator_lock("io"), "old-host:9:OLDPROC1:cd", px=30_000)
    try:
        held = _scrape()
    finally:
        client.delete(lock, keys.orchestrator_lock("io"))

    assert vacant["lumastra_leader_seat_held"] == {(("seat", "cluster"),): 0}
    assert "lumastra_leader" not in vacant
    assert held["lumastra_leader_seat_held"] == {(("seat", "cluster"),): 1}
    assert held["lumastra_leader"] == {(("instance", "hosta:1:LEADER01"), ("seat", "cluster")): 1}


@pytest.mark.worker
def test_counts_follow_real_runs(celery_worker: object) -> None:
    before = _scrape()
    runs = [start_run("test-noop", {}, trigger=TriggerKind.API) for _ in range(3)]
    failed = start_run("test-fail", {"how": "permanent"}, trigger=TriggerKind.API)
    for handle in runs:
        handle.wait(timeout=30)
    with pytest.raises(RunFailed):
        failed.wait(timeout=30)
    after = _scrape()

    def delta(name: str, *labels: tuple[str, str]) -> float:
        key = tuple(sorted(labels))
        return after.get(name, {}).get(key, 0) - before.get(name, {}).get(key, 0)

    assert delta("lumastra_task_runs_total", ("task", "test-noop"), ("state", "completed")) == 3
    assert delta("lumastra_task_runs_total", ("task", "test-fail"), ("state", "failed")) == 1
    assert delta("lumastra_task_duration_seconds_count", ("task", "test-noop")) == 3
    assert (
        delta("lumastra_task_duration_seconds_bucket", ("task", "test-noop"), ("le", "+Inf")) == 3
    )
    assert delta("lumastra_delivery_total", ("event", "published")) == 4


def test_refusals_and_spend_are_counted() -> None:
    valkey.client().delete(keys.metrics(counters.REFUSALS), keys.metrics(counters.COST))
    costs.record("test-noop", "cpu_seconds", 1.5)
    costs.record("test-noop", "cpu_seconds", 2.0)
    refused = 0
    for _ in range(10):  # test-quota allows a few runs a day, then refuses
        try:
            start_run("test-quota", {"how": "permanent"}, trigger=TriggerKind.API)
        except QuotaExceeded:
            refused += 1

    samples = _scrape()

    spent = samples["lumastra_task_cost_units_total"]
    assert spent[(("kind", "cpu_seconds"), ("task", "test-noop"))] == 3.5
    refusals = samples["lumastra_task_refusals_total"]
    assert refused > 0
    assert refusals[(("code", QuotaExceeded.code), ("task", "test-quota"))] == refused


def test_two_web_processes_report_the_same_cluster_totals() -> None:
    counters.add(counters.RUNS, ("test-noop", "completed"), 7)
    texts = []
    with ExitStack() as stack:
        urls = [
            stack.enter_context(web_process(f"web-metrics-{n}", LUMASTRA_METRICS_TOKEN=TOKEN))
            for n in range(2)
        ]
        for url in urls:
            response = requests.get(
                f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
            )
            assert response.status_code == 200
            texts.append(response.text)

    first, second = (_samples(text)["lumastra_task_runs_total"] for text in texts)
    assert first == second
    assert first[(("state", "completed"), ("task", "test-noop"))] >= 7


def test_a_scrape_without_the_token_counts_toward_the_sign_in_budget() -> None:
    client = Client()
    for _ in range(settings.CONFIG.auth_failure_limit):
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong")

    blocked = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert blocked.status_code == 429 and "Retry-After" in blocked


@pytest.fixture
def cached_for_a_minute(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, metrics_cache_s=60)
    monkeypatch.setattr(cache, "_down_until", 0.0)
    cache.client.cache_clear()
    cache.client().delete(keys.cached("metrics"))
    yield
    settings.CONFIG = dataclasses.replace(config, metrics_cache_s=60)  # the cache a test moved
    cache.client.cache_clear()
    cache.client().delete(keys.cached("metrics"))
    cache.client.cache_clear()


def test_one_body_serves_every_scrape_until_it_expires_from_the_cache_valkey(
    cached_for_a_minute: None,
) -> None:
    before = _scrape()
    counters.add(counters.REFUSALS, ("test-metrics-cache", "quota_exceeded"))

    again = _scrape(Client())  # another client, as another replica's scrape would be

    assert again == before
    assert cache.client().pttl(keys.cached("metrics")) > 50_000
    cache.client().delete(keys.cached("metrics"))
    refusals = _scrape()["lumastra_task_refusals_total"]
    assert refusals[(("code", "quota_exceeded"), ("task", "test-metrics-cache"))] >= 1


def test_a_cache_valkey_that_is_gone_costs_only_the_computation(
    cached_for_a_minute: None, caplog: pytest.LogCaptureFixture
) -> None:
    settings.CONFIG = dataclasses.replace(
        settings.CONFIG, valkey_cache_url=f"redis://127.0.0.1:{free_port()}/0"
    )
    cache.client.cache_clear()

    assert "lumastra_leader_seat_held" in _scrape()
    assert [r for r in caplog.records if "the cache Valkey failed" in r.getMessage()]
    caplog.clear()
    assert "lumastra_leader_seat_held" in _scrape()
    # Inside the pause the cache is not asked again: no second failure, no connect timeout.
    assert not [r for r in caplog.records if "the cache Valkey failed" in r.getMessage()]


def _by(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str
) -> dict[str, float]:
    """A one-label family's samples, by that label's value."""
    return {labels[0][1]: value for labels, value in samples[name].items()}


def test_the_roster_counts_processes_by_role_and_the_expected_roles_even_at_zero() -> None:
    nodes = [
        roster.Node(f"metrics-host:{n}:TEST", "metrics-host", n, role, (), "")
        for n, role in enumerate(("worker", "worker", "loops", "watcher"))
    ]
    before = _by(_scrape(), "lumastra_roster_nodes")
    for node in nodes:
        roster.announce(node)
    try:
        after = _by(_scrape(), "lumastra_roster_nodes")
    finally:
        valkey.client().delete(*(keys.cluster_node(node.instance_id) for node in nodes))

    assert {"worker", "loops", *settings.LUMASTRA_WORKER_CHILDREN} <= before.keys()
    assert after["worker"] - before["worker"] == 2
    assert after["loops"] - before["loops"] == 1
    assert after["watcher"] - before.get("watcher", 0) == 1


def test_the_drain_s_lists_and_every_kind_of_dead_letter_are_counted() -> None:
    clean_drain(CLUSTER)
    client = valkey.client()
    client.lpush(keys.drain_pending(), "entry-1", "entry-2")
    client.lpush(keys.drain_inflight(), "entry-3")
    client.lpush(keys.drain_poison(), "poisoned-1")
    endpoint, _ = create_endpoint("https://hooks.invalid/metrics", states=[], tasks=[])
    try:
        before = _by(_scrape(), "lumastra_dead_letters")
        for exhausted in (True, True, False):
            TaskHistory.objects.create(
                id=(run_id := new_run_id()),
                task_id="test-fail",
                state=RunState.FAILED,
                error={"kind": "transient", "message": "down", "exhausted": exhausted},
                trigger={"kind": "api"},
                input={},
                priority=5,
                identity=run_id,
            )
        for status in (DeliveryStatus.DEAD, DeliveryStatus.PENDING):
            WebhookDelivery.objects.create(
                endpoint=endpoint,
                event_id=f"ev-{status}",
                event_type="run.failed",
                run_id="run_x",
                envelope={},
                status=status,
            )
        samples = _scrape()
    finally:
        clean_drain(CLUSTER)

    assert _by(samples, "lumastra_drain_entries") == {"waiting": 3, "poison": 1}
    dead = _by(samples, "lumastra_dead_letters")
    assert dead["exhausted_run"] - before["exhausted_run"] == 2
    assert dead["webhook_delivery"] - before["webhook_delivery"] == 1
    assert dead["drain_poison"] == 1


def test_each_class_s_cap_is_the_one_admission_judges_by() -> None:
    samples = _scrape()

    caps = _by(samples, "lumastra_task_queue_depth_cap")
    assert caps.keys() == _by(samples, "lumastra_task_queue_depth").keys()
    assert caps == {name: class_limit(name).cap for name in caps}


def _pending(created_ago_s: int, not_before_in_s: int | None) -> None:
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id, task_id="test-noop", trigger={"kind": "api"}, input={}, priority=5,
        identity=run_id,
    )  # fmt: skip
    # Postgres's clock, the one the wait is read by.
    TaskHistory.objects.filter(id=run_id).update(
        created_at=Now() - timedelta(seconds=created_ago_s),
        not_before=None if not_before_in_s is None else Now() + timedelta(seconds=not_before_in_s),
    )


def test_a_class_s_wait_is_its_oldest_due_run_s_from_its_creation_or_its_not_before() -> None:
    TaskHistory.objects.filter(state=RunState.PENDING).delete()
    idle = _by(_scrape(), "lumastra_task_queue_wait_seconds")
    _pending(3600, 120)  # not due yet: not waiting
    _pending(3600, -90)  # a retry due 90 s ago waits from then
    retried = _by(_scrape(), "lumastra_task_queue_wait_seconds")
    _pending(300, None)  # a run never delayed waits from its creation
    created = _by(_scrape(), "lumastra_task_queue_wait_seconds")

    assert set(idle.values()) == {0}
    assert 90 <= retried["io"] < 120
    assert 300 <= created["io"] < 330
    assert {name: wait for name, wait in created.items() if name != "io"} == {
        name: 0 for name in created if name != "io"
    }
