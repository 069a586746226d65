"""Operators' notifications: written where their events happen, sent through Apprise to a real
local HTTP receiver (`json://`) by the notification loop, retried while it is down, each kind
within its hourly budget, each target once."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from orchestrator.api.access import Access
from orchestrator.clock import FrozenClock
from orchestrator.models import (
    Notification,
    NotificationKind,
    NotificationStatus,
    PauseScope,
    TaskCircuitState,
    TaskHistory,
)
from orchestrator.notifications import events, targets
from orchestrator.notifications.delivery import Notifier
from orchestrator.recovery import drain_poison
from orchestrator.recovery import windows as opening
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks.window import Window
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.servers import free_port
from tests.support.task_defs import FLAKY_KEY
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
WINDOW_TASK = "test-record-order"  # class maintenance
WINDOW_QUEUE = f"task.t.{WINDOW_TASK}"


@dataclasses.dataclass
class Receiver:
    """A `json://` endpoint on a fixed port: up or down at the test's word."""

    port: int
    received: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/notify"

    def up(self) -> None:
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def titles(self) -> list[str]:
        return [message["title"] for message in self.received]


@contextmanager
def _receiver(*, up: bool = True) -> Iterator[Receiver]:
    receiver = Receiver(free_port())
    if up:
        receiver.up()
    try:
        yield receiver
    finally:
        receiver.down()


def _configured(**changes: Any) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, **changes)


@pytest.fixture(autouse=True)
def _config_restored() -> Iterator[None]:
    config = settings.CONFIG
    yield
    settings.CONFIG = config


def _dead_letter_rows() -> list[Notification]:
    return list(Notification.objects.filter(kind=NotificationKind.DEAD_LETTER).order_by("id"))


@pytest.mark.worker
def test_each_dead_letter_is_one_message_and_none_is_lost_while_the_receiver_is_down() -> None:
    valkey.client().delete(FLAKY_KEY)
    with worker_process(["task.t.test-flaky"], concurrency=1, name="notify"):
        dead = [
            start_run(
                "test-flaky", {"label": f"dead-{i}", "fail_times": 9}, trigger=TriggerKind.MANUAL
            )
            for i in range(3)
        ]
        recovers = start_run(
            "test-flaky", {"label": "recovers", "fail_times": 1}, trigger=TriggerKind.MANUAL
        )
        for run in [*dead, recovers]:
            wait_for(
                lambda run_id=run.run_id: TaskHistory.objects.get(id=run_id).finished_at,
                timeout=60,
            )

    rows = _dead_letter_rows()
    assert sorted(row.subject for row in rows) == sorted(run.run_id for run in dead)
    assert all(row.status == NotificationStatus.PENDING for row in rows)
    clock = FrozenClock(timezone.now())
    with _receiver(up=False) as receiver:
        notifier = Notifier(targets.parse([receiver.url]), clock=clock)
        # Down for 30 s: every pass that finds them due fails them, and keeps them.
        report = notifier.tick()
        assert (report.sent, report.failed) == (0, 3)
        for _ in range(3):
            clock.advance(timedelta(seconds=10))
            notifier.tick()
        assert all(row.status == NotificationStatus.PENDING for row in _dead_letter_rows())
        # Apprise's own words for the first; the others were not tried again in that pass.
        errors = sorted(row.last_error for row in _dead_letter_rows())
        assert "Connection error occurred sending JSON notification to 127.0.0.1" in errors[0]
        assert (
            errors[1:]
            == [f"{errors[1].split(':')[0]}: not tried, it failed earlier in this pass"] * 2
        )
        receiver.up()
        for _ in range(12):  # past the longest backoff of a few attempts
            clock.advance(timedelta(seconds=60))
            notifier.tick()

        assert len(receiver.received) == 3
        assert all(row.status == NotificationStatus.SENT for row in _dead_letter_rows())
        for run in dead:
            (message,) = [m for m in receiver.received if run.run_id in m["message"]]
            assert message["title"] == "Dead letter: test-flaky exhausted its retries"
            assert (
                f"{settings.CONFIG.console_url}/admin/orchestrator/taskhistory/"
                in (message["message"])
            )
            assert message["type"] == "failure"


def test_a_kind_over_its_hourly_budget_waits_and_goes_as_one_digest() -> None:
    _configured(notify_max_per_hour=3)
    clock = FrozenClock(T0)
    with _receiver() as receiver:
        notifier = Notifier(targets.parse([receiver.url]), clock=clock)
        for i in range(10):
            events.notify(NotificationKind.DEAD_LETTER, subject=f"run_{i}", title=f"dead {i}")
        Notification.objects.update(next_attempt_at=T0)

        notifier.tick()

        assert receiver.titles() == ["dead 0", "dead 1", "8 dead letters"]
        digest = receiver.received[2]["message"]
        assert "- dead 2" in digest and "- dead 9" in digest
        assert "notification/?kind__exact=dead_letter" in digest
        assert Notification.objects.filter(status=NotificationStatus.SENT).count() == 10

        # The hour's budget is spent: more of the kind wait for it, another kind does not.
        events.notify(NotificationKind.DEAD_LETTER, subject="run_late", title="dead late")
        events.notify(NotificationKind.TEST, subject="ops", title="a test")
        Notification.objects.filter(status=NotificationStatus.PENDING).update(next_attempt_at=T0)
        report = notifier.tick()
        assert (report.held, receiver.titles()[3:]) == (1, ["a test"])
        late = Notification.objects.get(subject="run_late")
        assert (late.status, late.next_attempt_at) == (NotificationStatus.PENDING, T0 + HOUR)

        clock.advance(HOUR)
        notifier.tick()
        assert receiver.titles()[4:] == ["dead late"]


def test_each_target_gets_its_kinds_once_and_a_retry_goes_only_where_it_failed() -> None:
    clock = FrozenClock(T0)
    with _receiver() as only_dead, _receiver(up=False) as everything:
        notifier = Notifier(
            targets.parse([f"dead_letter={only_dead.url}", everything.url]), clock=clock
        )
        events.notify(NotificationKind.DEAD_LETTER, subject="run_1", title="dead 1")
        events.notify(NotificationKind.TEST, subject="ops", title="a test")
        Notification.objects.update(next_attempt_at=T0)

        notifier.tick()
        assert only_dead.titles() == ["dead 1"]
        assert Notification.objects.filter(status=NotificationStatus.PENDING).count() == 2

        everything.up()
        clock.advance(HOUR)
        notifier.tick()
        assert sorted(everything.titles()) == ["a test", "dead 1"]
        assert only_dead.titles() == ["dead 1"]  # not sent there again
        assert set(Notification.objects.values_list("status", flat=True)) == {"sent"}
        assert {len(row.sent_to) for row in Notification.objects.all()} == {1, 2}


def test_a_notification_dies_after_its_attempts_and_one_no_target_wants_is_kept_unsent() -> None:
    _configured(notify_max_attempts=2)
    clock = FrozenClock(T0)
    with _receiver(up=False) as down:
        notifier = Notifier(targets.parse([f"test={down.url}"]), clock=clock)
        events.notify(NotificationKind.TEST, subject="ops", title="a test")
        events.notify(NotificationKind.CIRCUIT_OPEN, subject="task-x", title="circuit")
        Notification.objects.update(next_attempt_at=T0)
        notifier.tick()
        clock.advance(HOUR)
        notifier.tick()

    assert Notification.objects.get(kind="test").status == NotificationStatus.DEAD
    assert Notification.objects.get(kind="circuit_open").status == NotificationStatus.UNSENT


def test_targets_refuse_an_unknown_kind_and_an_unknown_service_without_echoing_secrets() -> None:
    with pytest.raises(targets.InvalidTarget, match="unknown kinds \\['dead_leter'\\]"):
        targets.parse(["dead_leter=json://127.0.0.1/x"])
    with pytest.raises(targets.InvalidTarget) as refused:
        targets.parse(["nosuchservice://user:s3cret@host/x"])
    assert "s3cret" not in str(refused.value)
    (target,) = targets.parse(["ntfy://user:s3cret@ntfy.example.org/topic"])
    assert "s3cret" not in target.shown()


def test_a_circuit_opening_is_notified_once_per_opening() -> None:
    def copy(
        state: str, opened_at: datetime | None, consecutive: int = 5, task: str = "test-flaky"
    ) -> None:
        TaskCircuitState.objects.update_or_create(
            task_id=task,
            defaults={
                "state": state,
                "opened_at": opened_at,
                "half_open_at": opened_at and opened_at + timedelta(minutes=1),
                "consecutive_failures": consecutive,
                "updated_at": T0,
            },
        )

    copy("closed", None, 0)
    copy("open", T0)
    copy("open", T0, 6)  # the same opening, copied again
    copy("half_open", T0)
    copy("open", T0 + HOUR)  # its probe failed: open again
    copy("open", T0, task="test-noop")  # a first copy that is already open

    opened = list(Notification.objects.filter(kind="circuit_open").order_by("id"))
    assert [row.subject for row in opened] == ["test-flaky", "test-flaky", "test-noop"]
    assert opened[0].title == "Circuit open: test-flaky"
    assert "after 5 failures in a row" in opened[0].body


def test_the_drain_poison_list_growing_is_notified_once_per_growth() -> None:
    coordination = valkey.client()
    coordination.delete(keys.drain_poison(), keys.poison_noticed())
    notifier = Notifier([])
    try:
        notifier.tick()  # empty: nothing to say
        drain_poison.add('{"not": "an entry"}', None, "ValueError: unreadable")
        drain_poison.add('{"nor": "this"}', None, "ValueError: unreadable")
        notifier.tick()
        notifier.tick()  # no growth since
        drain_poison.add('{"a": "third"}', None, "ValueError: unreadable")
        notifier.tick()
    finally:
        coordination.delete(keys.drain_poison(), keys.poison_noticed())

    titles = list(
        Notification.objects.filter(kind="poison_growing")
        .order_by("id")
        .values_list("title", flat=True)
    )
    assert titles == ["Drain poison list grew to 2 (+2)", "Drain poison list grew to 3 (+1)"]
    assert Notification.objects.get(subject="2").link.endswith("/dead-letters/")


def test_no_credential_of_a_target_reaches_postgres_or_the_targets_name() -> None:
    clock = FrozenClock(T0)
    with _receiver(up=False) as down:
        secret_url = f"json://s3cret@127.0.0.1:{down.port}/notify?+X-Token=t0ken"
        (target,) = targets.parse([secret_url])
        assert "s3cret" not in repr(target) and "t0ken" not in target.shown()
        events.notify(NotificationKind.TEST, subject="ops", title="a test")
        Notification.objects.update(next_attempt_at=T0)
        Notifier([target], clock=clock).tick()

    row = Notification.objects.get(kind="test")
    assert row.last_error and row.status == NotificationStatus.PENDING
    stored = f"{row.last_error} {row.sent_to} {row.body}"
    assert "s3cret" not in stored and "t0ken" not in stored
    with pytest.raises(targets.InvalidTarget, match="listed twice"):
        targets.parse([secret_url, secret_url])


def test_a_retry_to_a_target_that_was_down_is_one_message_outside_the_budget() -> None:
    _configured(notify_max_per_hour=3)
    clock = FrozenClock(T0)
    with _receiver() as up, _receiver(up=False) as down:
        notifier = Notifier(targets.parse([up.url, down.url]), clock=clock)
        for i in range(5):
            events.notify(NotificationKind.DEAD_LETTER, subject=f"run_{i}", title=f"dead {i}")
        Notification.objects.update(next_attempt_at=T0)

        notifier.tick()
        assert up.titles() == ["dead 0", "dead 1", "3 dead letters"]

        down.up()
        clock.advance(HOUR / 2)  # past every backoff, within the hour the budget counts
        notifier.tick()
        assert down.titles() == ["5 dead letters"]
        assert up.titles() == ["dead 0", "dead 1", "3 dead letters"]
        assert set(Notification.objects.values_list("status", flat=True)) == {"sent"}


def test_the_test_button_needs_operate_and_records_a_test_notification() -> None:
    page = "/admin/orchestrator/notification/"
    viewer = Client()
    account("viewer", Access.VIEW)
    viewer.login(username="viewer", password=PASSWORD)
    listed = viewer.get(page)
    assert listed.status_code == 200 and b"Send test notification" not in listed.content
    assert viewer.post(f"{page}test/").status_code == 403
    ops = Client()
    operator()
    ops.login(username="ops", password=PASSWORD)
    assert ops.get(f"{page}test/").status_code == 405

    answer = ops.post(f"{page}test/", follow=True)

    assert answer.status_code == 200
    (row,) = Notification.objects.filter(kind="test")
    assert row.subject == "ops" and row.status == NotificationStatus.PENDING
    assert b"Send test notification" in answer.content
    assert b"Lumastra test notification" in answer.content


def test_a_window_that_closes_on_runs_still_waiting_is_notified() -> None:
    valkey.client().delete(keys.pauses(), keys.window_releases())
    empty_queues(WINDOW_QUEUE)
    opens = timezone.now().astimezone(UTC) + timedelta(hours=3)
    window = Window(f"{opens:%H:%M}-{opens + HOUR:%H:%M}", tz="UTC")
    state = opening.set_window(PauseScope.CLASS, "maintenance", window, by="ops").state(
        timezone.now()
    )
    assert state.opens_at is not None
    assert not Notification.objects.filter(kind="window_held").exists()  # closed on nothing
    for index in range(3):
        start_run(WINDOW_TASK, {"label": str(index)}, trigger=TriggerKind.MANUAL)
    opening.tick(clock=FrozenClock(state.opens_at + timedelta(seconds=1)))

    # No worker took them in its hour: it closes on three runs still waiting.
    opening.tick(clock=FrozenClock(state.opens_at + HOUR + timedelta(seconds=1)))

    (told,) = Notification.objects.filter(kind="window_held")
    assert told.title == "Run window of class maintenance closed with 3 runs waiting"
    valkey.client().delete(keys.pauses(), keys.window_releases())
    empty_queues(WINDOW_QUEUE)
