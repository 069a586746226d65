"""The Dead letters page: every kind of dead letter seeded the way it happens (a flaky task
exhausting its retries on a real worker, a terminal write Postgres kept refusing, a webhook
receiver that is down, a catalog event the dispatcher cannot handle), counted and listed in
one place; operators act on them through the orchestrator and the admin log records it;
view-only users see no action and are refused a forged POST."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import psycopg2
import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone

from coverage.dispatcher import Dispatcher
from coverage.models import EventOutbox, MediaItem
from coverage.stages import covered, sync
from orchestrator.admin import dead_letters
from orchestrator.api.access import Access
from orchestrator.clock import FrozenClock
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.models import DeliveryStatus, TaskHistory, WebhookDelivery
from orchestrator.recovery import drain_poison, drain_replay
from orchestrator.recovery.drain_replay import MAX_ATTEMPTS
from orchestrator.runs import drain
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, live, valkey
from orchestrator.triggers import TriggerKind
from orchestrator.webhooks.delivery import Deliverer, create_endpoint
from tests.support.fixtures import database_url, wait_for, worker_process
from tests.support.runs import clean_drain, seed_active
from tests.support.task_defs import FLAKY_KEY
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "/admin/orchestrator/taskhistory/dead-letters/"
OUTBOX_REDELIVER = "/admin/coverage/eventoutbox/dead-letters/redeliver/"
OWNER = "host-b:777:CAFEBABE"


@pytest.fixture(autouse=True)
def _clean_drain() -> None:
    clean_drain(CLUSTER)


@pytest.fixture
def _fail_fast() -> Iterator[None]:
    """One attempt before a webhook delivery or a catalog event dead-letters; local receivers
    allowed (the refused one is on 127.0.0.1)."""
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(
        config,
        webhook_allow_private=True,
        webhook_max_attempts=1,
    )
    coverage = settings.COVERAGE
    settings.COVERAGE = dataclasses.replace(coverage, dispatch_max_attempts=1)
    yield
    settings.CONFIG = config
    settings.COVERAGE = coverage


def _client(user: object) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)  # type: ignore[attr-defined]
    return client


def _logged(client_user: object) -> list[str]:
    return list(
        LogEntry.objects.filter(user_id=client_user.pk)  # type: ignore[attr-defined]
        .order_by("id")
        .values_list("change_message", flat=True)
    )


def _section(key: str) -> dead_letters.Section:
    (found,) = [s for s in dead_letters.sections() if s.key == key]
    return found


# --- seeding, the way each dead letter comes about ------------------------------------------


def _exhausted_run() -> str:
    """test-flaky failing more often than its three attempts allow, on a real worker."""
    valkey.client().delete(FLAKY_KEY)
    with worker_process(["task.t.test-flaky"], concurrency=1, name="dead-letters"):
        handle = start_run(
            "test-flaky", {"label": "dead-letter", "fail_times": 9}, trigger=TriggerKind.MANUAL
        )
        wait_for(
            lambda: TaskHistory.objects.filter(id=handle.run_id, state="failed").exists(),
            timeout=30,
        )
    return handle.run_id


def _poisoned_write() -> str:
    """A terminal write whose row another transaction holds through every replay."""
    run_id = seed_active(OWNER)
    drain.push(
        run_id, RunState.COMPLETED, {"result": {"ok": True}, "finished_at": timezone.now()}, OWNER
    )
    other = psycopg2.connect(database_url())
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT 1 FROM task_history WHERE id = %s FOR UPDATE", [run_id])
            for _ in range(MAX_ATTEMPTS):
                drain_replay.replay(force=True, lock_timeout=timedelta(milliseconds=50))
    finally:
        other.rollback()
        other.close()
    assert [e.run_id for e in drain_poison.poisoned()] == [run_id]
    return run_id


def _unreadable_entry() -> None:
    valkey.client().lpush(keys.drain_pending(), "{not json")
    assert drain_replay.replay(force=True).poisoned == 1


def _dead_delivery() -> WebhookDelivery:
    """A run's event to a receiver that refuses the connection."""
    create_endpoint("http://127.0.0.1:9/hooks", states=["cancelling"], tasks=[])
    handle = start_run("test-record-order", {"label": "hooked"}, trigger=TriggerKind.API)
    TaskHistory.objects.filter(id=handle.run_id).update(state=RunState.CANCELLING)
    Deliverer(FrozenClock(timezone.now())).tick()
    delivery = WebhookDelivery.objects.get(run_id=handle.run_id)
    assert delivery.status == DeliveryStatus.DEAD
    return delivery


def _dead_event() -> tuple[EventOutbox, MediaItem]:
    """A catalog event whose stage condition divides by zero (test-tracks, a track of 1999)."""
    sync(covered())
    album = MediaItem.objects.create(kind="album", library="Music", title="lp")
    track = MediaItem.objects.create(
        kind="track", library="Music", title="bad", parent=album, year=1999
    )
    EventOutbox.objects.exclude(item_id=track.pk).delete()
    Dispatcher(FrozenClock(timezone.now())).tick()
    event = EventOutbox.objects.get(item_id=track.pk)
    assert event.dead_at is not None
    return event, track


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.worker
def test_a_run_that_exhausted_its_retries_is_listed_and_requeued_as_a_new_run() -> None:
    run_id = _exhausted_run()
    user = operator("requeuer")
    client = _client(user)

    page = client.get(PAGE).content.decode()
    section = _section("exhausted-runs")
    assert section.count == 1 and [r.id for r in section.rows] == [run_id]
    assert run_id in page and "?outcome=dead-letter" in page
    assert f'value="requeue:{run_id}"' in page

    client.post(PAGE, {"row": f"requeue:{run_id}"})

    retry = TaskHistory.objects.exclude(id=run_id).get(task_id="test-flaky")
    assert retry.trigger == {"kind": "operator-retry", "actor": "requeuer", "retryOf": run_id}
    assert retry.priority == 1
    assert _logged(user) == [f"requeued dead letter {run_id} as run {retry.id}"]
    # The original stays a dead letter, marked as requeued.
    (row,) = _section("exhausted-runs").rows
    assert row.note == f"requeued as {retry.id}"


def test_exhausted_runs_are_read_through_their_partial_index() -> None:
    from django.db import connection

    query = TaskHistory.objects.filter(state="failed", error__exhausted=True).order_by(
        "-created_at"
    )[:50]
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            plan = query.explain()
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "task_history_dead_letters" in plan


def test_a_poisoned_write_is_replayed_and_an_unreadable_one_discarded() -> None:
    run_id = _poisoned_write()
    _unreadable_entry()
    user = operator("drainer")
    client = _client(user)

    section = _section("drain-poison")
    assert section.count == 2
    unreadable, readable = section.rows  # newest first
    assert readable.actions == ("replay", "discard") and unreadable.actions == ("discard",)
    assert readable.cells[-1] == "active"  # the run, as Postgres has it now
    page = client.get(PAGE).content.decode()
    assert f'value="replay:{readable.id}"' in page
    assert f'value="replay:{unreadable.id}"' not in page

    client.post(PAGE, {"row": f"replay:{unreadable.id}"})  # refused: nothing to replay
    client.post(PAGE, {"row": f"replay:{readable.id}"})
    assert drain.depth() == (1, 1)
    assert drain_replay.replay(force=True).applied == 1  # the next drain pass applies it
    assert TaskHistory.objects.get(id=run_id).state == RunState.COMPLETED
    assert live.read(run_id)["state"] == "completed"

    client.post(PAGE, {"row": f"discard:{unreadable.id}"})
    assert drain.depth() == (0, 0)
    client.post(PAGE, {"row": f"discard:{unreadable.id}"})  # gone already: nothing logged

    assert _logged(user) == [
        f"replayed the poisoned completed write of run {run_id}",
        "discarded an entry from the drain poison list",
    ]


def test_two_operators_replaying_one_record_queue_it_once() -> None:
    _poisoned_write()
    (entry,) = drain_poison.poisoned()

    drain_poison.replay_poisoned(entry.record_id)
    with pytest.raises(drain_poison.PoisonGone):
        drain_poison.replay_poisoned(entry.record_id)

    assert drain.depth() == (1, 0)


@pytest.mark.usefixtures("_fail_fast")
def test_dead_webhook_deliveries_and_outbox_events_are_redelivered() -> None:
    delivery = _dead_delivery()
    event, track = _dead_event()
    user = operator("redeliverer")
    client = _client(user)

    page = client.get(PAGE).content.decode()
    assert _section("dead-webhooks").count == 1
    assert _section("dead-outbox-events").count == 1
    assert "status__exact=dead" in page and "dead_at__isempty=0" in page
    assert f'formaction="{OUTBOX_REDELIVER}"' in page

    client.post(PAGE, {"bulk": "redeliver", "selected": [str(delivery.pk)]})
    client.post(OUTBOX_REDELIVER, {"row": f"redeliver:{event.pk}"})

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.PENDING, 0)
    event.refresh_from_db()
    assert (event.dead_at, event.attempts) == (None, 0)
    MediaItem.objects.filter(pk=track.pk).update(year=2001)  # the cause, fixed
    EventOutbox.objects.exclude(pk=event.pk).delete()
    assert Dispatcher().tick().dispatched == 1
    assert _logged(user) == ["redelivered 1 webhook deliveries", "redelivered 1 outbox events"]
    assert _section("dead-webhooks").count == 0 and _section("dead-outbox-events").count == 0


@pytest.mark.usefixtures("_fail_fast")
def test_view_only_users_see_every_section_but_no_action_and_are_refused_a_post() -> None:
    _poisoned_write()
    delivery = _dead_delivery()
    event, _ = _dead_event()
    viewer = account("viewer", Access.VIEW)
    client = _client(viewer)

    response = client.get(PAGE)

    assert response.status_code == 200
    page = response.content.decode()
    for section in ("exhausted-runs", "drain-poison", "dead-webhooks", "dead-outbox-events"):
        assert f'id="{section}"' in page
    for control in ('name="row"', 'name="bulk"', 'name="selected"'):
        assert control not in page
    (poisoned,) = drain_poison.poisoned()
    assert client.post(PAGE, {"row": f"discard:{poisoned.record_id}"}).status_code == 403
    assert client.post(PAGE, {"row": f"redeliver:{delivery.pk}"}).status_code == 403
    assert client.post(OUTBOX_REDELIVER, {"row": f"redeliver:{event.pk}"}).status_code == 403
    assert drain.depth() == (0, 1)
    delivery.refresh_from_db()
    event.refresh_from_db()
    assert delivery.status == DeliveryStatus.DEAD and event.dead_at is not None
    assert _logged(viewer) == []


def test_a_forged_post_without_csrf_is_refused() -> None:
    _poisoned_write()
    (poisoned,) = drain_poison.poisoned()
    client = Client(enforce_csrf_checks=True)
    assert client.login(username=operator("forger").username, password=PASSWORD)

    response = client.post(PAGE, {"row": f"discard:{poisoned.record_id}"})

    assert response.status_code == 403
    assert drain.depth() == (0, 1)


def test_a_source_that_fails_is_shown_and_the_others_still_render(
    settings: object,
) -> None:
    settings.LUMASTRA_DEAD_LETTER_SOURCES = [  # type: ignore[attr-defined]
        "tests.support.no_such_module.section",
        "coverage.dead_letters.outbox_section",
    ]
    client = _client(operator("reader"))

    page = client.get(PAGE).content.decode()

    assert "This section could not be read" in page
    assert 'id="dead-outbox-events"' in page and 'id="drain-poison"' in page
