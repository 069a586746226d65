"""Webhooks on real components: run events from a real worker's runs, written by the trigger in
the run's own transactions, delivered by the webhook loop to a real local HTTP server, signed;
a receiver that is down is retried, dead-lettered and redelivered from the admin."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import Client
from django.utils import timezone

from lumastra.webhooks import HEADER, DuplicateDelivery, WebhookVerificationError, sign, verify
from orchestrator.api import tokens
from orchestrator.clock import FrozenClock
from orchestrator.models import (
    DeliveryStatus,
    RunEventOutbox,
    TaskHistory,
    WebhookDelivery,
    WebhookEndpoint,
)
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from orchestrator.webhooks.delivery import Deliverer, create_endpoint
from tests.support.users import PASSWORD, operator

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _local_receivers_allowed() -> Iterator[None]:
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, webhook_allow_private=True)
    yield
    settings.CONFIG = config


@dataclass
class Receiver:
    url: str
    status: int = 200
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.received.append(({k: v for k, v in self.headers.items()}, body))
            self.send_response(state.status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def _api() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator(), 'hooks')[1]}"})


def _events_for(receiver: Receiver, run_id: str) -> list[dict[str, Any]]:
    """The run's events as received, in the order they happened (delivery is not ordered)."""
    events = [json.loads(body) for _, body in receiver.received]
    return sorted((e for e in events if e["subject"] == run_id), key=lambda e: e["time"])


@pytest.mark.worker
def test_a_runs_events_arrive_signed_as_cloudevents(
    receiver: Receiver, celery_worker: object
) -> None:
    created = _api().post(
        "/api/v1/webhooks", {"url": receiver.url}, content_type="application/json"
    )
    assert created.status_code == 201
    secret = created.json()["secret"]

    handle = start_run("test-noop", {}, trigger=TriggerKind.API)
    handle.wait(timeout=30)
    report = Deliverer().tick()

    assert report.delivered == report.fanned_out >= 3
    events = _events_for(receiver, handle.run_id)
    assert [e["type"] for e in events] == [
        "org.lumastra.task.run.pending",
        "org.lumastra.task.run.active",
        "org.lumastra.task.run.completed",
    ]
    last = events[-1]
    assert last["specversion"] == "1.0" and last["source"] == "/lumastra/runs"
    assert last["datacontenttype"] == "application/json" and last["time"].endswith("Z")
    assert last["data"]["state"] == "completed" and last["data"]["task"] == "test-noop"
    assert len({e["id"] for e in events}) == 3
    for headers, body in receiver.received:
        assert headers["Content-Type"] == "application/cloudevents+json"
        assert verify(body, headers[HEADER], secret)["id"]
    deliveries = WebhookDelivery.objects.filter(run_id=handle.run_id)
    assert set(deliveries.values_list("status", flat=True)) == {DeliveryStatus.DELIVERED}


def test_an_endpoint_gets_only_what_its_filter_asks_for(receiver: Receiver) -> None:
    create_endpoint(receiver.url, states=["cancelled"], tasks=["test-record-order"])
    wanted = start_run("test-record-order", {"label": "a"}, trigger=TriggerKind.API)
    other = start_run("test-unique", {"key": "b"}, trigger=TriggerKind.API)
    for handle in (wanted, other):
        TaskHistory.objects.filter(id=handle.run_id).update(state=RunState.CANCELLING)
        TaskHistory.objects.filter(id=handle.run_id).update(state=RunState.CANCELLED)

    Deliverer().tick()

    types = [(e["subject"], e["type"]) for _, body in receiver.received for e in [json.loads(body)]]
    assert types == [(wanted.run_id, "org.lumastra.task.run.cancelled")]


def test_events_are_written_with_the_change_or_not_at_all() -> None:
    # A task no worker of this session takes: only this test moves its run.
    handle = start_run("test-record-order", {"label": "x"}, trigger=TriggerKind.API)
    assert not RunEventOutbox.objects.exists()  # no endpoint: nothing is written
    create_endpoint("http://127.0.0.1:9/", states=[], tasks=[])

    with transaction.atomic():
        TaskHistory.objects.filter(id=handle.run_id).update(state=RunState.CANCELLING)
        assert RunEventOutbox.objects.count() == 1
        transaction.set_rollback(True)

    assert not RunEventOutbox.objects.exists()


def test_a_receiver_that_is_down_is_retried_then_dead_then_redelivered(
    receiver: Receiver,
) -> None:
    settings_before = settings.CONFIG
    settings.CONFIG = dataclasses.replace(settings.CONFIG, webhook_max_attempts=3)
    try:
        create_endpoint(receiver.url, states=["cancelling"], tasks=[])
        handle = start_run("test-record-order", {"label": "down"}, trigger=TriggerKind.API)
        TaskHistory.objects.filter(id=handle.run_id).update(state=RunState.CANCELLING)
        receiver.status = 503
        clock = FrozenClock(timezone.now())
        deliverer = Deliverer(clock)

        first = deliverer.tick()
        delivery = WebhookDelivery.objects.get(run_id=handle.run_id)
        assert (first.failed, delivery.attempts, delivery.status) == (1, 1, "pending")
        assert delivery.last_status_code == 503
        assert delivery.next_attempt_at > clock.now() + timedelta(seconds=4)
        assert deliverer.tick().failed == 0  # not due yet

        for _ in range(2):
            clock.advance(timedelta(hours=2))
            deliverer.tick()
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == (DeliveryStatus.DEAD, 3)
        assert len(receiver.received) == 3

        receiver.status = 200
        admin = Client()
        user = operator("hook-admin")
        assert admin.login(username=user.username, password=PASSWORD)
        admin.post(
            "/admin/orchestrator/webhookdelivery/",
            {"action": "redeliver_deliveries", "_selected_action": [delivery.pk]},
        )
        Deliverer().tick()
    finally:
        settings.CONFIG = settings_before

    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DELIVERED
    assert len(receiver.received) == 4


def test_internal_addresses_and_redirects_are_refused(receiver: Receiver) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, webhook_allow_private=False)
    create_endpoint(receiver.url, states=[], tasks=[])
    start_run("test-record-order", {"label": "ssrf"}, trigger=TriggerKind.API)

    Deliverer().tick()

    delivery = WebhookDelivery.objects.get()
    assert "internal address" in delivery.last_error and "127.0.0.1" in delivery.last_error
    assert receiver.received == []

    settings.CONFIG = dataclasses.replace(settings.CONFIG, webhook_allow_private=True)
    receiver.status = 302
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    Deliverer().tick()
    delivery.refresh_from_db()
    assert delivery.last_status_code == 302 and delivery.status == "pending"


def test_verify_refuses_forged_tampered_stale_and_replayed_deliveries() -> None:
    body = json.dumps({"id": "evt_1", "type": "org.lumastra.task.run.completed"}).encode()
    header = sign(body, "whsec_right")
    seen: set[str] = set()

    def replayed(event_id: str) -> bool:
        if event_id in seen:
            return True
        seen.add(event_id)
        return False

    assert verify(body, header, "whsec_right", seen=replayed)["id"] == "evt_1"
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify(body, header, "whsec_forged")
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify(body.replace(b"completed", b"failed"), header, "whsec_right")
    stale = sign(body, "whsec_right", at=int(timezone.now().timestamp()) - 600)
    with pytest.raises(WebhookVerificationError, match="past the tolerance"):
        verify(body, stale, "whsec_right")
    with pytest.raises(DuplicateDelivery, match="delivered before"):
        verify(body, header, "whsec_right", seen=replayed)
    with pytest.raises(WebhookVerificationError, match="malformed"):
        verify(body, "v1=abc", "whsec_right")
    # Longer than Python turns into an int (4,300 digits): malformed, not a crash.
    with pytest.raises(WebhookVerificationError, match="malformed"):
        verify(body, f"t={'9' * 5000},v1=abc", "whsec_right")


def test_endpoints_over_http() -> None:
    api = _api()

    bad = api.post("/api/v1/webhooks", {"url": "ftp://x"}, content_type="application/json")
    unknown = api.post(
        "/api/v1/webhooks",
        {"url": "http://127.0.0.1:9/", "states": ["exploded"]},
        content_type="application/json",
    )
    made = api.post(
        "/api/v1/webhooks", {"url": "http://127.0.0.1:9/"}, content_type="application/json"
    )
    listed = api.get("/api/v1/webhooks").json()

    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"][-1] == "url"
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["loc"][-2] == "states"
    no_task = api.post(
        "/api/v1/webhooks",
        {"url": "http://127.0.0.1:9/", "tasks": ["no-such-task"]},
        content_type="application/json",
    )
    assert no_task.status_code == 404 and "no-such-task" in no_task.json()["detail"]
    assert made.status_code == 201 and made.json()["secret"].startswith("whsec_")
    assert listed == [{k: v for k, v in made.json().items() if k != "secret"}]
    assert api.delete(f"/api/v1/webhooks/{made.json()['id']}").status_code == 204
    assert api.delete(f"/api/v1/webhooks/{made.json()['id']}").status_code == 404
    assert not WebhookEndpoint.objects.exists()
